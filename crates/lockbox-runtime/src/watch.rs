//! File watching: the agent watches (inotify, inside the sandbox) and sends events; the
//! reader task puts them in the watch's bounded [`WatchSink`]; [`WatchStream`] takes them.
//! Dropping the stream forgets the sink and asks the agent to stop.

use lockbox_agent::{Body, Op};
use std::sync::Arc;

use crate::agent::{AgentClient, WatchSink};
use crate::files::{check_path, map_error};
use crate::streams::WatchStream;
use crate::RuntimeError;

/// The agent's bound on watches per sandbox.
const MAX_WATCHES: usize = 32;

/// Stops the watch when the stream is dropped.
struct Unwatch {
    agent: AgentClient,
    id: u64,
    /// The runtime the watch was made on: the stream may be dropped on a thread of no
    /// runtime (a Python caller closing it).
    handle: tokio::runtime::Handle,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        self.agent.unregister_watch(self.id);
        if self.agent.is_closed() {
            return;
        }
        let agent = self.agent.clone();
        let watch = self.id;
        self.handle.spawn(async move {
            let _ = agent.call(Op::Unwatch { watch }).await;
        });
    }
}

pub(crate) async fn watch(
    agent: &AgentClient,
    path: &str,
    recursive: bool,
) -> Result<WatchStream, RuntimeError> {
    check_path(path)?;
    let handle = tokio::runtime::Handle::try_current().map_err(RuntimeError::internal)?;
    let (id, sink) = agent.register_watch();
    let guard = Unwatch {
        agent: agent.clone(),
        id,
        handle,
    };
    let (result, _) = agent
        .call(Op::Watch {
            watch: id,
            path: path.to_owned(),
            recursive,
        })
        .await?;
    let body = result.map_err(|e| match e.errno {
        libc::EMFILE => RuntimeError::LimitReached {
            what: "watches per sandbox".into(),
            limit: MAX_WATCHES,
        },
        libc::ENOSPC => RuntimeError::LimitReached {
            what: format!("inotify watches of the sandbox's user ({})", e.message),
            limit: 0,
        },
        _ => map_error(e, path, false),
    })?;
    let Body::Watching {
        path: watched,
        is_dir,
    } = body
    else {
        return Err(body.unexpected("watching").into());
    };
    let events = futures_util::stream::unfold(
        (sink, guard),
        |(sink, guard): (Arc<WatchSink>, Unwatch)| async move {
            let ev = sink.next().await?;
            Some((ev, (sink, guard)))
        },
    );
    Ok(WatchStream {
        path: watched,
        is_dir,
        inner: Box::pin(events),
    })
}
