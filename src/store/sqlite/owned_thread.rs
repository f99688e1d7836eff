//! A named OS thread fed by a channel, that ends with its owner: dropping
//! the owner closes the channel, and the thread, having finished what was
//! queued, returns. Tests open and drop hundreds of stores; none may leave a
//! thread (or an open database file) behind.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

pub(super) struct OwnedThread<M> {
    sender: Option<Sender<M>>,
    handle: Option<JoinHandle<()>>,
}

impl<M: Send + 'static> OwnedThread<M> {
    /// Starts `body` on a thread named `name` (at most 15 bytes: the kernel
    /// truncates longer names in `top` and `/proc`). `body` must return once
    /// its receiver reports the channel closed.
    pub(super) fn spawn(
        name: &str,
        body: impl FnOnce(Receiver<M>) + Send + 'static,
    ) -> io::Result<Self> {
        let (sender, receiver) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || body(receiver))?;
        Ok(Self {
            sender: Some(sender),
            handle: Some(handle),
        })
    }

    /// Queues `message`; gives it back when the thread has stopped.
    pub(super) fn send(&self, message: M) -> Result<(), M> {
        match &self.sender {
            Some(sender) => sender.send(message).map_err(|e| e.0),
            None => Err(message),
        }
    }
}

impl<M> Drop for OwnedThread<M> {
    /// Closes the channel and waits for the thread, so that its connection
    /// is closed when the owner is gone and the file can be reopened at once.
    /// This blocks at most for the job in progress (bounded by SQLite's busy
    /// timeout) and whatever was still queued; abandoned jobs are skipped.
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(handle) = self.handle.take()
            && handle.join().is_err()
        {
            tracing::error!("sqlite store: a background thread panicked");
        }
    }
}
