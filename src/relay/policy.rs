//! What an attempt's answer means for its job.

use std::time::{Duration, SystemTime};

use http::header::RETRY_AFTER;

use crate::settings::QueueSettings;
use crate::store::outbox::Settle;
use crate::upstream::{Buffered, UpstreamError};

/// Decides how attempt number `attempt` of a job received at `received`
/// ends, at `now`.
pub fn decide(
    queue: &QueueSettings,
    attempt: u32,
    received: SystemTime,
    now: SystemTime,
    answer: &Result<Buffered, UpstreamError>,
) -> Settle {
    let (status, error, retry_after) = match answer {
        Ok(a) if a.parts.status.is_success() => {
            return Settle::Delivered {
                status: a.parts.status.as_u16(),
            };
        }
        Ok(a) => {
            let status = a.parts.status;
            if queue.dead_on.contains(&status) {
                return Settle::Dead {
                    status: Some(status.as_u16()),
                    error: format!(
                        "the app answered {status}, which queue.dead_on sends to the dead letter"
                    ),
                };
            }
            let retry_after = a
                .parts
                .headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            (
                Some(status.as_u16()),
                format!("the app answered {status}"),
                retry_after,
            )
        }
        Err(e) => (None, e.to_string(), None),
    };
    if attempt >= queue.max_attempts {
        return Settle::Dead {
            status,
            error: format!("{error}; max_attempts ({}) used up", queue.max_attempts),
        };
    }
    let wait = backoff(queue, attempt, rand::random::<f64>()).max(retry_after.unwrap_or_default());
    let age = now.duration_since(received).unwrap_or_default();
    if age + wait > queue.max_age {
        return Settle::Dead {
            status,
            error: format!(
                "{error}; max_age ({}) would pass before the next attempt",
                humantime::format_duration(queue.max_age)
            ),
        };
    }
    Settle::Retry {
        after: wait,
        status,
        error,
    }
}

/// `retry_initial` doubled per attempt, at most `retry_max`, varied by
/// `jitter` either way (`unit` is uniform in [0, 1)).
pub fn backoff(queue: &QueueSettings, attempt: u32, unit: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(32);
    let base = queue
        .retry_initial
        .saturating_mul(1u32 << doublings.min(31))
        .min(queue.retry_max);
    let factor = 1.0 + queue.jitter * (2.0 * unit - 1.0);
    base.mul_f64(factor.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn queue() -> QueueSettings {
        QueueSettings {
            accept_status: StatusCode::ACCEPTED,
            max_attempts: 5,
            max_age: Duration::from_secs(3600),
            retry_initial: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            jitter: 0.2,
            lease: Duration::from_secs(60),
            concurrency: 4,
            dead_on: vec![StatusCode::BAD_REQUEST, StatusCode::GONE],
        }
    }

    fn answer(status: u16, retry_after: Option<&str>) -> Result<Buffered, UpstreamError> {
        let mut response = http::Response::builder().status(status);
        if let Some(v) = retry_after {
            response = response.header("retry-after", v);
        }
        let (parts, ()) = response.body(()).unwrap().into_parts();
        Ok(Buffered {
            parts,
            body: bytes::Bytes::new(),
            cut: None,
        })
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_within_the_jitter() {
        let q = queue();
        assert_eq!(backoff(&q, 1, 0.5), Duration::from_secs(1));
        assert_eq!(backoff(&q, 3, 0.5), Duration::from_secs(4));
        assert_eq!(backoff(&q, 30, 0.5), Duration::from_secs(60));
        assert_eq!(backoff(&q, u32::MAX, 0.5), Duration::from_secs(60));
        assert_eq!(backoff(&q, 3, 0.0), Duration::from_millis(3200));
        assert_eq!(backoff(&q, 3, 1.0), Duration::from_millis(4800));
    }

    #[test]
    fn answers_decide_delivered_retry_or_dead() {
        let q = queue();
        let now = SystemTime::now();
        assert_eq!(
            decide(&q, 1, now, now, &answer(204, None)),
            Settle::Delivered { status: 204 }
        );
        assert!(matches!(
            decide(&q, 1, now, now, &answer(410, None)),
            Settle::Dead {
                status: Some(410),
                ..
            }
        ));
        for retryable in [500, 503, 408, 429, 409] {
            assert!(
                matches!(
                    decide(&q, 1, now, now, &answer(retryable, None)),
                    Settle::Retry { .. }
                ),
                "{retryable}"
            );
        }
        let timeout = Err(UpstreamError::Timeout(Duration::from_secs(1)));
        assert!(matches!(
            decide(&q, 1, now, now, &timeout),
            Settle::Retry { status: None, .. }
        ));
        // Retry-After is honoured when later than the backoff.
        match decide(&q, 1, now, now, &answer(503, Some("120"))) {
            Settle::Retry { after, .. } => assert_eq!(after, Duration::from_secs(120)),
            other => panic!("{other:?}"),
        }
        // The last attempt, or an age past max_age, ends in the dead letter.
        assert!(matches!(
            decide(&q, 5, now, now, &answer(500, None)),
            Settle::Dead { .. }
        ));
        // 3599.9 s old: any next attempt (at least 0.8 s away) is past it.
        let old = now - Duration::from_millis(3_599_900);
        assert!(matches!(
            decide(&q, 1, old, now, &answer(500, None)),
            Settle::Dead { .. }
        ));
    }
}
