//! A named OS thread fed by a bounded queue, that ends with its owner:
//! dropping the owner closes the queue, and the thread, having finished what
//! was queued, returns. Tests open and drop hundreds of stores; none may
//! leave a thread (or an open database file) behind.
//!
//! The queue holds at most `capacity` messages, so that a burst applies
//! backpressure instead of growing memory. Senders are tasks on the
//! runtime's worker threads, which must never block: a sender first takes
//! a place in the queue from a semaphore, an async wait that frees its
//! worker meanwhile, and the thread gives the place back as it takes the
//! message off the queue.

use std::io;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub(super) struct OwnedThread<M> {
    sender: Option<SyncSender<Queued<M>>>,
    /// One permit per free place in the queue.
    places: Arc<Semaphore>,
    handle: Option<JoinHandle<()>>,
}

/// A message, with the place in the queue it holds until it is taken.
type Queued<M> = (M, OwnedSemaphorePermit);

/// The thread's end of the queue.
pub(super) struct Queue<M> {
    receiver: Receiver<Queued<M>>,
}

impl<M: Send + 'static> OwnedThread<M> {
    /// Starts `body` on a thread named `name` (at most 15 bytes: the kernel
    /// truncates longer names in `top` and `/proc`), fed by a queue of
    /// `capacity` messages (at least one). `body` must return once its
    /// queue reports the channel closed.
    pub(super) fn spawn(
        name: &str,
        capacity: usize,
        body: impl FnOnce(Queue<M>) + Send + 'static,
    ) -> io::Result<Self> {
        let capacity = capacity.max(1);
        let (sender, receiver) = mpsc::sync_channel(capacity);
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || body(Queue { receiver }))?;
        Ok(Self {
            sender: Some(sender),
            places: Arc::new(Semaphore::new(capacity)),
            handle: Some(handle),
        })
    }

    /// Queues `message`, waiting while the queue is full; gives it back
    /// when the thread has stopped. Dropping the future while it waits
    /// leaves nothing queued.
    pub(super) async fn send(&self, message: M) -> Result<(), M> {
        let Some(sender) = &self.sender else {
            return Err(message);
        };
        let Ok(place) = Arc::clone(&self.places).acquire_owned().await else {
            return Err(message);
        };
        // Messages queued never outnumber the permits taken, so holding one
        // there is room: `try_send` cannot find the queue full (and, unlike
        // `send`, could not block the worker if it did).
        sender.try_send((message, place)).map_err(|e| match e {
            mpsc::TrySendError::Full((m, _)) | mpsc::TrySendError::Disconnected((m, _)) => m,
        })
    }
}

impl<M> Queue<M> {
    /// The next message, waiting at most `timeout`. Taking it frees its
    /// place for a waiting sender.
    pub(super) fn recv_timeout(&self, timeout: Duration) -> Result<M, RecvTimeoutError> {
        self.receiver
            .recv_timeout(timeout)
            .map(|(message, _place)| message)
    }

    /// The next message if one is queued.
    pub(super) fn try_recv(&self) -> Result<M, TryRecvError> {
        self.receiver.try_recv().map(|(message, _place)| message)
    }
}

impl<M> Drop for OwnedThread<M> {
    /// Closes the channel and waits for the thread, so that its connection
    /// is closed when the owner is gone and the file can be reopened at once.
    /// This blocks at most for the job in progress (bounded by SQLite's busy
    /// timeout) and whatever was still queued; abandoned jobs are skipped.
    /// No sender can be waiting for a place: each borrows the owner.
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(handle) = self.handle.take()
            && handle.join().is_err()
        {
            tracing::error!("sqlite store: a background thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Waker};

    use super::*;

    /// With the thread held busy, `CAPACITY` messages fill the queue and the
    /// next send waits, unqueued, until the thread takes one. Closing the
    /// queue then lets the thread finish every message, in order.
    #[tokio::test]
    async fn a_full_queue_makes_the_next_send_wait() {
        const CAPACITY: usize = 4;
        let (release, released) = mpsc::channel::<()>();
        let (got, received) = mpsc::channel();
        let thread = OwnedThread::spawn("owned-t-bound", CAPACITY, move |queue: Queue<usize>| {
            let _ = released.recv();
            while let Ok(n) = queue.recv_timeout(Duration::from_secs(3600)) {
                got.send(n).unwrap();
            }
        })
        .unwrap();
        // Declared after `thread`, so dropped first: a failing assertion
        // lets the thread go instead of joining it while it is held.
        let release = release;
        for n in 0..CAPACITY {
            thread.send(n).await.unwrap();
        }

        {
            let mut next = pin!(thread.send(CAPACITY));
            let polled = next.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            assert!(polled.is_pending(), "a message was queued past capacity");
            release.send(()).unwrap();
            next.await.unwrap();
        }

        drop(thread);
        let received: Vec<usize> = received.iter().collect();
        assert_eq!(received, (0..=CAPACITY).collect::<Vec<_>>());
    }
}
