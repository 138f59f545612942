//! A process's bounded, cursor-addressed output log.
//!
//! The cursor of a byte is the number of bytes logged before it, over the process's whole
//! life, so it never changes and readers resume exactly. When the log holds more than its
//! bound, the oldest bytes are dropped; a read below the oldest retained byte is answered
//! from the oldest one with `truncated: true`. Readers never block writers: the reader
//! tasks append as output arrives, whether anyone is attached or not.

use bytes::Bytes;
use futures_util::Stream;
use std::collections::VecDeque;
use std::sync::Mutex;
use tokio::sync::{broadcast, watch};

use crate::sandbox::LogReservation;
use crate::types::{LogChunk, LogSegment, OutputStream};

/// Live chunks kept for a PTY viewer that has not caught up (each at most
/// [`crate::util::READ_CHUNK`] bytes, so at most 4 MiB a process); a viewer further behind
/// skips ahead, and the log still has every byte.
const LIVE_BACKLOG: usize = 64;

#[derive(Debug)]
struct Inner {
    segments: VecDeque<LogSegment>,
    /// Cursor of the oldest retained byte.
    start: u64,
    /// Cursor after the newest byte.
    end: u64,
    eof: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct ProcessLog {
    inner: Mutex<Inner>,
    cap: u64,
    /// The bytes of the runtime's log budget this log may fill; given back with the log.
    _reserved: Option<LogReservation>,
    /// `end`, and whether the log is complete: wakes followers.
    changed: watch::Sender<(u64, bool)>,
    /// Live bytes for PTY viewers.
    live: broadcast::Sender<Bytes>,
}

impl ProcessLog {
    /// A log of the bytes `reserved` (at least one).
    pub fn new(reserved: LogReservation) -> ProcessLog {
        let mut log = ProcessLog::unreserved(reserved.bytes());
        log._reserved = Some(reserved);
        log
    }

    /// A log of `cap` bytes outside any budget.
    fn unreserved(cap: usize) -> ProcessLog {
        ProcessLog {
            _reserved: None,
            inner: Mutex::new(Inner {
                segments: VecDeque::new(),
                start: 0,
                end: 0,
                eof: false,
            }),
            cap: cap.max(1) as u64,
            changed: watch::channel((0, false)).0,
            live: broadcast::channel(LIVE_BACKLOG).0,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends output of `stream`, evicting the oldest bytes beyond the bound.
    pub fn append(&self, stream: OutputStream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let mut g = self.lock();
        let offset = g.end;
        // Keep only what can be retained.
        let keep = &data[data.len().saturating_sub(self.cap as usize)..];
        let skipped = (data.len() - keep.len()) as u64;
        if skipped > 0 {
            // This append alone fills the bound: everything older goes.
            g.segments.clear();
        }
        let merged = match g.segments.back_mut() {
            Some(last)
                if last.stream == stream
                    && last.offset + last.data.len() as u64 == offset + skipped
                    && last.data.len() < 64 * 1024 =>
            {
                let mut v = Vec::with_capacity(last.data.len() + keep.len());
                v.extend_from_slice(&last.data);
                v.extend_from_slice(keep);
                last.data = Bytes::from(v);
                true
            }
            _ => false,
        };
        if !merged {
            g.segments.push_back(LogSegment {
                stream,
                offset: offset + skipped,
                data: Bytes::copy_from_slice(keep),
            });
        }
        g.end = offset + data.len() as u64;
        g.start = g.segments.front().map_or(g.end, |first| first.offset);
        // Evict from the front.
        while g.end - g.start > self.cap {
            let excess = g.end - g.start - self.cap;
            let Some(front) = g.segments.front_mut() else {
                break;
            };
            let len = front.data.len() as u64;
            if len <= excess {
                g.start = front.offset + len;
                g.segments.pop_front();
            } else {
                front.data = front.data.slice(excess as usize..);
                front.offset += excess;
                g.start = front.offset;
            }
        }
        g.start = g.segments.front().map_or(g.end, |first| first.offset);
        let end = g.end;
        // Sent under the lock so a viewer subscribing under it sees no gap and no repeat.
        let _ = self.live.send(Bytes::copy_from_slice(data));
        drop(g);
        self.changed.send_replace((end, false));
    }

    /// Marks the log complete: the process exited and its output is all in.
    pub fn finish(&self) {
        let mut g = self.lock();
        g.eof = true;
        let end = g.end;
        drop(g);
        self.changed.send_replace((end, true));
    }

    /// Total bytes ever logged.
    pub fn end(&self) -> u64 {
        self.lock().end
    }

    /// Up to `max` bytes from cursor `since`.
    pub fn read(&self, since: u64, max: usize) -> LogChunk {
        let g = self.lock();
        let truncated = since < g.start;
        let from = since.max(g.start).min(g.end);
        let mut left = max as u64;
        let mut segments = Vec::new();
        let mut next = from;
        for seg in &g.segments {
            let seg_end = seg.offset + seg.data.len() as u64;
            if seg_end <= from || left == 0 {
                continue;
            }
            let lo = from.saturating_sub(seg.offset);
            let hi = (lo + left).min(seg.data.len() as u64);
            let data = seg.data.slice(lo as usize..hi as usize);
            left -= hi - lo;
            next = seg.offset + hi;
            segments.push(LogSegment {
                stream: seg.stream,
                offset: seg.offset + lo,
                data,
            });
        }
        LogChunk {
            segments,
            next,
            truncated,
            eof: g.eof && next == g.end,
        }
    }

    /// The retained bytes (PTY scrollback) and a receiver of everything after them.
    pub fn subscribe(&self) -> (Bytes, broadcast::Receiver<Bytes>) {
        let g = self.lock();
        let mut all = Vec::with_capacity((g.end - g.start) as usize);
        for seg in &g.segments {
            all.extend_from_slice(&seg.data);
        }
        let rx = self.live.subscribe();
        drop(g);
        (Bytes::from(all), rx)
    }

    /// Replay from `since`, then live chunks; ends after the chunk with `eof`.
    pub fn follow(
        self: std::sync::Arc<Self>,
        since: u64,
    ) -> impl Stream<Item = LogChunk> + Send + 'static {
        let rx = self.changed.subscribe();
        futures_util::stream::unfold(
            (self, since, rx, false),
            |(log, cursor, mut rx, done)| async move {
                if done {
                    return None;
                }
                loop {
                    let chunk = log.read(cursor, 256 * 1024);
                    if !chunk.segments.is_empty() || chunk.truncated || chunk.eof {
                        let next = chunk.next;
                        let eof = chunk.eof;
                        return Some((chunk, (log, next, rx, eof)));
                    }
                    if rx.changed().await.is_err() {
                        return None;
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn bytes(c: &LogChunk) -> Vec<u8> {
        c.segments.iter().flat_map(|s| s.data.to_vec()).collect()
    }

    #[test]
    fn reads_resume_exactly_at_the_cursor() {
        let log = ProcessLog::unreserved(1024);
        log.append(OutputStream::Stdout, b"hello ");
        log.append(OutputStream::Stderr, b"err");
        log.append(OutputStream::Stdout, b"world");
        let a = log.read(0, 4);
        assert_eq!(bytes(&a), b"hell");
        let b = log.read(a.next, 100);
        assert_eq!(bytes(&b), b"o errworld");
        assert_eq!(b.segments.len(), 3);
        assert_eq!(b.segments[1].stream, OutputStream::Stderr);
        assert_eq!(b.next, 14);
        assert!(!b.truncated && !b.eof);
        log.finish();
        assert!(log.read(b.next, 10).eof);
    }

    #[test]
    fn eviction_keeps_the_newest_bytes_and_marks_truncated_reads() {
        let log = ProcessLog::unreserved(10);
        for i in 0..10u8 {
            log.append(OutputStream::Stdout, &[b'0' + i; 3]);
        }
        assert_eq!(log.end(), 30);
        let c = log.read(0, 100);
        assert!(c.truncated);
        assert_eq!(c.segments[0].offset, 20);
        assert_eq!(bytes(&c), b"6777888999");
        let fresh = log.read(25, 100);
        assert!(!fresh.truncated);
        assert_eq!(bytes(&fresh), b"88999");
    }

    #[test]
    fn a_large_append_after_small_ones_evicts_them_all() {
        let log = ProcessLog::unreserved(4);
        log.append(OutputStream::Stdout, b"xy");
        log.append(OutputStream::Stderr, b"abcdefgh");
        log.append(OutputStream::Stderr, b"Z");
        let c = log.read(0, 100);
        assert!(c.truncated);
        assert_eq!(bytes(&c), b"fghZ");
        assert_eq!(c.segments[0].offset, 7);
    }

    #[test]
    fn a_single_append_larger_than_the_bound_keeps_its_tail() {
        let log = ProcessLog::unreserved(4);
        log.append(OutputStream::Stdout, b"abcdefgh");
        let c = log.read(0, 100);
        assert!(c.truncated);
        assert_eq!(bytes(&c), b"efgh");
        assert_eq!(c.segments[0].offset, 4);
        assert_eq!(c.next, 8);
    }
}
