//! Background processes: started by the agent under a subreaper shim, output read by a
//! task per process into its [`ProcessLog`], exit recorded when the agent reports it.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use crate::agent::{AgentClient, ExitStatus};
use crate::log::ProcessLog;
use crate::sandbox::LogReservation;
use crate::types::{OutputStream, ProcessId, ProcessInfo, ProcessState};
use crate::util::{read_pending, read_some, Read, READ_CHUNK};
use crate::RuntimeError;
use lockbox_agent::Io;

/// One background process.
#[derive(Debug)]
pub(crate) struct Process {
    pub id: ProcessId,
    pub pid: i32,
    pub command: Vec<String>,
    pub started_at: std::time::SystemTime,
    pub log: Arc<ProcessLog>,
    /// stdin pipe (or the PTY master, shared with the reader).
    pub input: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    pub pty: Option<Arc<AsyncFd<OwnedFd>>>,
    exit: watch::Sender<Option<ExitStatus>>,
}

impl Process {
    /// Wraps a started process and starts its reader task; `fds` as the agent sent them
    /// for `io`.
    pub fn start(
        agent: &AgentClient,
        id: ProcessId,
        pid: i32,
        command: Vec<String>,
        fds: Vec<OwnedFd>,
        io: Io,
        log: LogReservation,
    ) -> Result<Arc<Process>, RuntimeError> {
        let mut fds = fds.into_iter();
        let mut next = || -> Result<Arc<AsyncFd<OwnedFd>>, RuntimeError> {
            let fd = fds
                .next()
                .ok_or_else(|| RuntimeError::Agent("sent too few descriptors".into()))?;
            Ok(Arc::new(crate::util::async_fd(fd)?))
        };
        let (input, outputs, master) = if let Io::Pty { .. } = io {
            let m = next()?;
            (
                Some(m.clone()),
                vec![(OutputStream::Pty, m.clone())],
                Some(m),
            )
        } else {
            let input = if let Io::Pipes { stdin: true } = io {
                Some(next()?)
            } else {
                None
            };
            let out = next()?;
            let err = next()?;
            (
                input,
                vec![(OutputStream::Stdout, out), (OutputStream::Stderr, err)],
                None,
            )
        };
        let process = Arc::new(Process {
            id,
            pid,
            command,
            started_at: std::time::SystemTime::now(),
            log: Arc::new(ProcessLog::new(log)),
            input: Mutex::new(input),
            pty: master,
            exit: watch::channel(None).0,
        });
        let p = process.clone();
        let agent = agent.clone();
        tokio::spawn(async move { p.pump(agent, outputs).await });
        Ok(process)
    }

    /// Copies output into the log until the process has exited and its pipes are drained.
    async fn pump(
        self: Arc<Self>,
        agent: AgentClient,
        outputs: Vec<(OutputStream, Arc<AsyncFd<OwnedFd>>)>,
    ) {
        let mut open: Vec<bool> = vec![true; outputs.len()];
        let mut buf = Vec::with_capacity(64 * 1024);
        let exited = agent.wait_exit(self.pid);
        tokio::pin!(exited);
        let status = loop {
            let readers: Vec<_> = outputs
                .iter()
                .enumerate()
                .filter(|(i, _)| open[*i])
                .map(|(i, (_, fd))| Box::pin(async move { (i, fd.readable().await) }))
                .collect();
            if readers.is_empty() {
                break (&mut exited).await.ok();
            }
            tokio::select! {
                s = &mut exited => break s.ok(),
                (r, _, _) = futures_util::future::select_all(readers) => {
                    let (i, ready) = r;
                    match ready {
                        Ok(mut g) => {
                            let read = read_some(g.get_inner(), READ_CHUNK, |d| buf.extend_from_slice(d));
                            if read == Read::Empty {
                                g.clear_ready();
                            }
                            self.log.append(outputs[i].0, &buf);
                            buf.clear();
                            if read == Read::Eof {
                                open[i] = false;
                            }
                        }
                        Err(_) => open[i] = false,
                    }
                }
            }
        };
        // The tree is gone: what it wrote is in the pipes (only that: a descriptor it passed
        // on to another process of the sandbox must not keep this task reading).
        for (i, (stream, fd)) in outputs.iter().enumerate() {
            if open[i] {
                read_pending(fd.get_ref(), &mut buf);
                self.log.append(*stream, &buf);
                buf.clear();
            }
        }
        if let Some(s) = status {
            agent.forget(self.pid);
            self.exit.send_replace(Some(s));
        } else {
            // The sandbox ended under the process.
            self.exit.send_replace(Some(ExitStatus {
                code: None,
                signal: Some(libc::SIGKILL),
            }));
        }
        *self.input.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.log.finish();
    }

    /// Its number (`p12` is 12): the order processes were started in.
    pub fn number(&self) -> u64 {
        self.id.trim_start_matches('p').parse().unwrap_or(0)
    }

    pub fn status(&self) -> Option<ExitStatus> {
        *self.exit.borrow()
    }

    /// Waits until the process has exited and its log is complete.
    pub async fn wait(&self) -> ExitStatus {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(s) = *rx.borrow_and_update() {
                return s;
            }
            if rx.changed().await.is_err() {
                return ExitStatus {
                    code: None,
                    signal: Some(libc::SIGKILL),
                };
            }
        }
    }

    pub fn info(&self) -> ProcessInfo {
        let status = self.status();
        ProcessInfo {
            id: self.id.clone(),
            pid: self.pid,
            command: self.command.clone(),
            state: if status.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit_code: status.and_then(|s| s.code),
            signal: status.and_then(|s| s.signal),
            started_at: self.started_at,
            pty: self.pty.is_some(),
            log_end: self.log.end(),
        }
    }

    /// Writes all of `data` to stdin (or the PTY).
    pub async fn write_input(&self, mut data: &[u8]) -> Result<(), RuntimeError> {
        let fd = self
            .input
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| self.no_input())?;
        while !data.is_empty() {
            let mut g = fd
                .writable()
                .await
                .map_err(RuntimeError::os("writing stdin"))?;
            match rustix::io::write(g.get_inner(), data) {
                Ok(n) => data = &data[n..],
                Err(rustix::io::Errno::AGAIN) => g.clear_ready(),
                Err(rustix::io::Errno::PIPE) | Err(rustix::io::Errno::IO) => {
                    return Err(RuntimeError::ProcessNotRunning {
                        id: self.id.to_string(),
                    })
                }
                Err(e) => return Err(RuntimeError::os("writing stdin")(e)),
            }
        }
        Ok(())
    }

    fn no_input(&self) -> RuntimeError {
        if self.status().is_some() {
            RuntimeError::ProcessNotRunning {
                id: self.id.to_string(),
            }
        } else {
            RuntimeError::NotSupported {
                id: self.id.to_string(),
                what: "stdin is closed (start it with stdin: true to write to it)".into(),
            }
        }
    }

    /// Closes stdin (the command sees EOF). For a PTY, sends the EOF character (^D).
    pub async fn close_input(&self) -> Result<(), RuntimeError> {
        if self.pty.is_some() {
            return self.write_input(b"\x04").await;
        }
        let taken = self.input.lock().unwrap_or_else(|p| p.into_inner()).take();
        taken.map(drop).ok_or_else(|| self.no_input())
    }

    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        let master = self
            .pty
            .as_ref()
            .ok_or_else(|| RuntimeError::NotSupported {
                id: self.id.to_string(),
                what: "it has no PTY".into(),
            })?;
        let size = rustix::termios::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        rustix::termios::tcsetwinsize(master.get_ref(), size).map_err(|e| {
            if self.status().is_some() {
                RuntimeError::ProcessNotRunning {
                    id: self.id.to_string(),
                }
            } else {
                RuntimeError::os("resizing the PTY")(e)
            }
        })
    }
}
