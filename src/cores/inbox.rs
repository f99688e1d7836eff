//! Answers that another thread hands to a core's tasks, with one wake-up
//! of the core for as many answers as it left before the core took them.
//!
//! Waking a task of a current-thread runtime from outside it writes to the
//! runtime's eventfd every time, whether the core sleeps or not (tokio's
//! `schedule` from a foreign thread: push, then unpark the I/O driver). The
//! sqlite store's thread answers a batch of jobs at once, several at 64
//! connections, all of them for the cores: one `write` for each made it
//! the gate's most frequent system call on sqlite duplicates (55,243 for
//! 50,175 requests, `strace -c -f`). Here the answers wait
//! in the core's inbox and the first one wakes the core's courier task,
//! which hands them all over on the core's own thread, where a wake-up is a
//! push onto its queue. (No tokio API wakes several of a runtime's tasks
//! with one unpark, so this is written here.)

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

/// Work left for a core: in practice, a job handed back to the task that
/// waits for it (the sqlite store's, `store_thread`), which the core then
/// frees: memory a core allocated goes back to its own arena.
pub trait Answer: Send {
    /// Runs on the core's thread.
    fn deliver(self: Box<Self>);
}

/// One core's answers from other threads.
#[derive(Default)]
pub struct Inbox {
    waiting: Mutex<Vec<Box<dyn Answer>>>,
    courier: Notify,
}

impl Inbox {
    /// Leaves `answer` to run on the core; the first answer since the
    /// courier last emptied the inbox wakes it.
    pub fn leave(&self, answer: Box<dyn Answer>) {
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.push(answer);
            waiting.len() == 1
        };
        if first {
            // A permit is kept if the courier is busy handing over the
            // last lot, so no answer is left behind.
            self.courier.notify_one();
        }
    }

    /// The core's courier: hands every answer over, on the core's thread,
    /// as they come. Runs until the core's runtime ends; answers left then
    /// are dropped with the last handle on the inbox (their tasks went
    /// with the runtime).
    pub async fn deliver(self: Arc<Self>) {
        let mut lot = Vec::new();
        loop {
            self.courier.notified().await;
            {
                let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                std::mem::swap(&mut lot, &mut *waiting);
            }
            for answer in lot.drain(..) {
                answer.deliver();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio::sync::oneshot;

    /// An answer that sends its number.
    struct Numbered(usize, oneshot::Sender<usize>);

    impl Answer for Numbered {
        fn deliver(self: Box<Self>) {
            let _ = self.1.send(self.0);
        }
    }

    /// Answers left from another thread reach the core's tasks, however
    /// they interleave with the courier's hand-overs.
    #[test]
    fn every_answer_left_from_another_thread_arrives() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let inbox = Arc::new(Inbox::default());
        runtime.block_on(async {
            tokio::spawn(Arc::clone(&inbox).deliver());
            let (senders, receivers): (Vec<_>, Vec<_>) =
                (0..1000).map(|_| oneshot::channel::<usize>()).unzip();
            let leaving = Arc::clone(&inbox);
            let thread = std::thread::spawn(move || {
                for (n, sender) in senders.into_iter().enumerate() {
                    leaving.leave(Box::new(Numbered(n, sender)));
                    if n % 7 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
            let all = async {
                for (n, receiver) in receivers.into_iter().enumerate() {
                    assert_eq!(receiver.await.unwrap(), n);
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(10), all)
                .await
                .expect("an answer left in the inbox never arrived");
            thread.join().unwrap();
        });
    }
}
