//! Long-lived responses (SSE and WebSocket): the `--max-streams` bound, the keepalive
//! comment, and the shutdown signal that ends them so a graceful stop does not wait on a
//! client that never disconnects.

use crate::error::ApiError;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::{Stream, StreamExt};
use serde_json::Value;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// Shared bookkeeping of open streams.
#[derive(Debug, Clone)]
pub struct Streams {
    permits: Arc<Semaphore>,
    max: usize,
    keepalive: Duration,
    shutdown: CancellationToken,
}

/// One open stream's slot; the slot is free again when this is dropped.
#[derive(Debug)]
pub struct StreamSlot {
    _permit: OwnedSemaphorePermit,
    shutdown: CancellationToken,
}

impl StreamSlot {
    /// Resolves when the server is shutting down.
    pub async fn shutdown(&self) {
        self.shutdown.cancelled().await;
    }
}

impl Streams {
    /// At most `max` streams at once; an SSE comment every `keepalive`.
    pub fn new(max: usize, keepalive: Duration, shutdown: CancellationToken) -> Streams {
        Streams {
            permits: Arc::new(Semaphore::new(max)),
            max,
            keepalive,
            shutdown,
        }
    }

    /// Takes a slot, or fails with 429 `LIMIT_REACHED` when all `--max-streams` are open.
    pub fn open(&self) -> Result<StreamSlot, ApiError> {
        let permit = Arc::clone(&self.permits)
            .try_acquire_owned()
            .map_err(|_| ApiError::limit("max_streams", self.max))?;
        Ok(StreamSlot {
            _permit: permit,
            shutdown: self.shutdown.clone(),
        })
    }

    /// An SSE response over `events` that holds `slot` while open, sends a keepalive comment
    /// every interval, and ends at shutdown.
    pub fn sse<S>(
        &self,
        slot: StreamSlot,
        events: S,
    ) -> Sse<impl Stream<Item = Result<Event, Infallible>> + Send + 'static>
    where
        S: Stream<Item = Event> + Send + 'static,
    {
        let stop = slot.shutdown.clone().cancelled_owned();
        let events = events
            .map(move |event| {
                // The slot lives exactly as long as the stream.
                let _held = &slot;
                Ok(event)
            })
            .take_until(stop);
        Sse::new(events).keep_alive(KeepAlive::new().interval(self.keepalive).text("keepalive"))
    }
}

/// An SSE event named `name` with a JSON payload.
pub fn json_event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}
