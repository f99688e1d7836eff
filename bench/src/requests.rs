//! Pre-signed requests: every byte a worker writes is built before the clock
//! starts, so the load generator spends its time on the wire, not on HMACs.
//!
//! Requests are Stripe deliveries signed with the gate's own
//! `Scheme::Stripe.sign`, each with its own event id. A pool is one buffer of
//! raw HTTP/1.1 requests plus, for each, what the answer must be.

use std::time::{SystemTime, UNIX_EPOCH};

use hookgate::provider::Scheme;

/// The secret the gate is configured with (written to a file for it).
pub const SECRET: &str = "whsec_hookgate_bench_0123456789abcdef";
/// A secret the gate does not know: signatures made with it are forgeries.
const FORGER_SECRET: &str = "whsec_not_the_configured_secret_000000";
/// Where the gate is configured to take Stripe deliveries.
pub const PATH: &str = "/webhooks/stripe";

/// What one request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An event id never sent before: verified, claimed, forwarded, marked.
    Fresh,
    /// An event already processed: verified, then answered from the store.
    Duplicate,
    /// Signed with the wrong secret: rejected before the store.
    Forged,
}

/// What a correct answer looks like.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    pub status: u16,
    /// The `Hookgate-Result` header, when the target is the gate.
    pub result: Option<&'static str>,
}

/// Who answers a row's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answerer {
    /// The upstream, directly or through nginx: 200 to everything.
    Upstream,
    /// The gate, forward mode: the app's 200 (`forwarded`).
    Forward,
    /// The gate, queue mode: 202 once the event and its job are committed
    /// (`accepted`), and 202 again for duplicates.
    Queue,
    /// bench/node/handler.js: 200 for a fresh event (`processed`) and for a
    /// duplicate (`duplicate`), 400 for a forgery.
    Node,
}

impl Expect {
    /// The answer of the gate, in either mode, or of the upstream alone.
    pub fn of(kind: Kind, by: Answerer) -> Self {
        let status = match by {
            // Baselines do not check anything: the upstream says 200 to all.
            Answerer::Upstream => {
                return Self {
                    status: 200,
                    result: None,
                };
            }
            Answerer::Forward | Answerer::Node => 200,
            Answerer::Queue => 202,
        };
        match kind {
            Kind::Fresh => Self {
                status,
                result: Some(match by {
                    Answerer::Queue => "accepted",
                    Answerer::Node => "processed",
                    _ => "forwarded",
                }),
            },
            Kind::Duplicate => Self {
                status,
                result: Some("duplicate"),
            },
            Kind::Forged => Self {
                status: 400,
                result: Some("invalid_signature"),
            },
        }
    }
}

/// One request: its bytes in the pool's buffer and its expected answer.
#[derive(Clone, Copy, Debug)]
pub struct Req {
    start: usize,
    len: usize,
    pub expect: Expect,
}

/// A sequence of ready-to-write requests.
pub struct Pool {
    bytes: Vec<u8>,
    reqs: Vec<Req>,
    /// Whether workers may start over at the end (baselines, duplicates and
    /// forgeries: repeating them changes nothing). A pool of fresh events
    /// must not repeat, so the run ends early when it is used up.
    pub cycle: bool,
}

impl Pool {
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    pub fn get(&self, index: usize) -> (&[u8], Expect) {
        let req = self.reqs[index];
        (&self.bytes[req.start..req.start + req.len], req.expect)
    }
}

/// A traffic mix in percent, summing to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    pub fresh: u32,
    pub duplicate: u32,
    pub forged: u32,
}

impl Mix {
    pub const FRESH: Self = Self {
        fresh: 100,
        duplicate: 0,
        forged: 0,
    };
    pub const DUPLICATE: Self = Self {
        fresh: 0,
        duplicate: 100,
        forged: 0,
    };
    pub const FORGED: Self = Self {
        fresh: 0,
        duplicate: 0,
        forged: 100,
    };
    /// The issue's mixed stream.
    pub const MIXED: Self = Self {
        fresh: 70,
        duplicate: 25,
        forged: 5,
    };

    /// Only duplicates and forgeries repeat harmlessly.
    fn repeats_safely(self) -> bool {
        self.fresh == 0
    }
}

/// Builds pools for one target.
pub struct Builder {
    host: String,
    timestamp: i64,
    by: Answerer,
    /// Prefixes every event id, so rows never share ids.
    salt: String,
}

impl Builder {
    pub fn new(port: u16, by: Answerer, salt: &str) -> Self {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Self {
            host: format!("127.0.0.1:{port}"),
            timestamp,
            by,
            salt: salt.to_owned(),
        }
    }

    /// `count` distinct events, each fresh the first time it is sent:
    /// the set that duplicates replay once it has gone through the gate.
    pub fn primed(&self, count: usize) -> Pool {
        let mut pool = empty(count, false);
        for i in 0..count {
            self.push(&mut pool, Kind::Fresh, &format!("dup{i}"));
        }
        pool
    }

    /// `count` requests in the proportions of `mix`, in a fixed shuffled
    /// order. Duplicates replay events of `primed`, which must have been
    /// sent (and answered 2xx) before.
    pub fn mixed(&self, count: usize, mix: Mix, primed: Option<&Pool>) -> Pool {
        let mut pool = empty(count, mix.repeats_safely());
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut dup_next = 0;
        for i in 0..count {
            let roll = (rng.next() % 100) as u32;
            let kind = if roll < mix.fresh {
                Kind::Fresh
            } else if roll < mix.fresh + mix.duplicate {
                Kind::Duplicate
            } else {
                Kind::Forged
            };
            match (kind, primed) {
                (Kind::Duplicate, Some(primed)) if primed.len() > 0 => {
                    let (bytes, _) = primed.get(dup_next % primed.len());
                    dup_next += 1;
                    let start = pool.bytes.len();
                    pool.bytes.extend_from_slice(bytes);
                    pool.reqs.push(Req {
                        start,
                        len: bytes.len(),
                        expect: Expect::of(Kind::Duplicate, self.by),
                    });
                }
                (Kind::Duplicate, _) => panic!("duplicates need a primed set"),
                (kind, _) => self.push(&mut pool, kind, &format!("{i}")),
            }
        }
        pool
    }

    fn push(&self, pool: &mut Pool, kind: Kind, id: &str) {
        let id = format!("evt_{}_{id}", self.salt);
        let body = event_body(&id, self.timestamp);
        let secret = match kind {
            Kind::Forged => FORGER_SECRET,
            Kind::Fresh | Kind::Duplicate => SECRET,
        };
        let headers = Scheme::Stripe.sign(secret.as_bytes(), body.as_bytes(), &id, self.timestamp);
        let start = pool.bytes.len();
        let out = &mut pool.bytes;
        out.extend_from_slice(b"POST ");
        out.extend_from_slice(PATH.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\nHost: ");
        out.extend_from_slice(self.host.as_bytes());
        out.extend_from_slice(b"\r\nUser-Agent: Stripe/1.0 (+https://stripe.com/docs/webhooks)");
        out.extend_from_slice(b"\r\nContent-Type: application/json; charset=utf-8\r\n");
        for (name, value) in headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        out.extend_from_slice(body.as_bytes());
        pool.reqs.push(Req {
            start,
            len: pool.bytes.len() - start,
            expect: Expect::of(kind, self.by),
        });
    }
}

fn empty(count: usize, cycle: bool) -> Pool {
    Pool {
        bytes: Vec::with_capacity(count * 900),
        reqs: Vec::with_capacity(count),
        cycle,
    }
}

/// A `payment_intent.succeeded` event shaped like Stripe's (about 800 bytes,
/// nested objects and nulls, so the key lookup and the canonical fingerprint
/// do their real work).
fn event_body(id: &str, created: i64) -> String {
    format!(
        concat!(
            r#"{{"id":"{id}","object":"event","api_version":"2024-06-20","created":{created},"#,
            r#""data":{{"object":{{"id":"pi_{id}","object":"payment_intent","amount":2000,"#,
            r#""amount_capturable":0,"amount_received":2000,"capture_method":"automatic","#,
            r#""client_secret":"pi_{id}_secret_bench","confirmation_method":"automatic","#,
            r#""created":{created},"currency":"usd","customer":"cus_Qbench0001","#,
            r#""description":"hookgate bench order","latest_charge":"ch_{id}","livemode":false,"#,
            r#""metadata":{{"order_id":"{id}","source":"bench"}},"payment_method":"pm_1Qbench","#,
            r#""payment_method_types":["card"],"receipt_email":null,"setup_future_usage":null,"#,
            r#""shipping":null,"statement_descriptor":null,"status":"succeeded"}}}},"#,
            r#""livemode":false,"pending_webhooks":1,"#,
            r#""request":{{"id":"req_bench","idempotency_key":"{id}"}},"#,
            r#""type":"payment_intent.succeeded"}}"#
        ),
        id = id,
        created = created
    )
}

/// A fixed-seed generator: every run sends the same sequence of kinds.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_pool_has_the_proportions_and_replays_primed_bytes() {
        let b = Builder::new(8080, Answerer::Forward, "t");
        let primed = b.primed(10);
        let pool = b.mixed(10_000, Mix::MIXED, Some(&primed));
        let (mut fresh, mut dup, mut forged) = (0, 0, 0);
        for i in 0..pool.len() {
            match pool.get(i).1.result {
                Some("forwarded") => fresh += 1,
                Some("duplicate") => dup += 1,
                Some("invalid_signature") => forged += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!((6_700..7_300).contains(&fresh), "{fresh}");
        assert!((2_200..2_800).contains(&dup), "{dup}");
        assert!((300..700).contains(&forged), "{forged}");
        assert!(!pool.cycle);
    }

    #[test]
    fn queue_mode_accepts_with_202_and_answers_duplicates_with_202() {
        let b = Builder::new(1, Answerer::Queue, "q");
        let primed = b.primed(2);
        assert_eq!(primed.get(0).1.status, 202);
        assert_eq!(primed.get(0).1.result, Some("accepted"));
        let dups = b.mixed(4, Mix::DUPLICATE, Some(&primed));
        assert_eq!(
            (dups.get(3).1.status, dups.get(3).1.result),
            (202, Some("duplicate"))
        );
        let forged = Expect::of(Kind::Forged, Answerer::Queue);
        assert_eq!(
            (forged.status, forged.result),
            (400, Some("invalid_signature"))
        );
        assert_eq!(Expect::of(Kind::Fresh, Answerer::Upstream).result, None);
    }

    #[test]
    fn requests_are_complete_http_with_a_stripe_signature() {
        let pool = Builder::new(1, Answerer::Forward, "t").mixed(2, Mix::FRESH, None);
        let (bytes, _) = pool.get(1);
        let text = std::str::from_utf8(bytes).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /webhooks/stripe HTTP/1.1\r\n"));
        assert!(head.contains("\r\nStripe-Signature: t="));
        assert!(head.contains(&format!("Content-Length: {}", body.len())));
        assert!(body.starts_with(r#"{"id":"evt_t_1","#));
    }
}
