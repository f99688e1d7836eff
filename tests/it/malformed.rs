//! Malformed requests through a real `hookgate run` process, over raw TCP so
//! that framing can be broken on purpose. Each gets its documented 4xx (or,
//! where the HTTP framing itself is broken, a 4xx or a closed connection):
//! never a 5xx, never a hang. Afterwards the gate still
//! forwards a valid delivery, and its memory stayed bounded.
//!
//! Bodies are signed correctly wherever the case is about what comes after
//! verification (the signature covers the raw bytes, before any parse).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use hookgate::provider::Scheme;

use crate::cli::Child;
use crate::support::fixture::GateFixture;
use crate::support::gate::{SECRET, signed, stripe_event};
use crate::support::upstream::Upstream;

const STD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const MIB: usize = 1024 * 1024;

/// What a case may get back.
#[derive(Debug)]
enum Expect {
    /// This status and `Hookgate-Result` code, from the gate's pipeline.
    Gate(u16, &'static str),
    /// Broken framing: a 4xx (from the HTTP layer, or from the gate once
    /// the parser made sense of it), or the connection closed unanswered.
    Refused,
}

struct Case {
    name: &'static str,
    request: Vec<u8>,
    expect: Expect,
}

/// An HTTP/1.1 request, byte for byte, with `Connection: close`.
fn request(method: &str, path: &str, headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: gate\r\nConnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn stripe(body: &[u8]) -> Vec<u8> {
    let headers = signed(&Scheme::Stripe, SECRET, body, "", None);
    request("POST", "/webhooks/stripe", &headers, body)
}

/// A Standard Webhooks delivery whose (signed) `webhook-id` is `id`.
fn standard(id: &str) -> Vec<u8> {
    let body = b"{\"type\":\"ping\"}";
    let headers = signed(&Scheme::Standard, STD_SECRET, body, id, None);
    request("POST", "/webhooks/std", &headers, body)
}

/// What came back: the status and `Hookgate-Result`, or `None` when the
/// connection closed without a status line. Writes on a thread of its own,
/// so an early answer to a large body is read while the body still flows.
fn exchange(addr: SocketAddr, bytes: Vec<u8>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    let mut writer = stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        let _ = writer.write_all(&bytes);
        let _ = writer.flush();
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let started = Instant::now();
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("no answer within {:?}: the gate hung", started.elapsed())
            }
            Err(_) => break,
        }
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    let _ = sender.join();
    let head = String::from_utf8_lossy(&got);
    let status = head.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let result = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("hookgate-result")
                .then(|| v.trim().to_owned())
        })
        .unwrap_or_default();
    Some((status, result))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn cases() -> Vec<Case> {
    let gate = |name, request, status, code| Case {
        name,
        request,
        expect: Expect::Gate(status, code),
    };
    let refused = |name, request| Case {
        name,
        request,
        expect: Expect::Refused,
    };
    let deep = |n: usize| {
        let mut b = b"{\"id\":\"evt_deep\",\"a\":".to_vec();
        b.extend(std::iter::repeat_n(b'[', n));
        b.extend(std::iter::repeat_n(b']', n));
        b.push(b'}');
        b
    };
    let ten_mib = vec![b'a'; 10 * MIB];
    let mut chunked_10mib =
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for _ in 0..10 {
        chunked_10mib.extend_from_slice(format!("{:x}\r\n", MIB).as_bytes());
        chunked_10mib.extend(std::iter::repeat_n(b'a', MIB));
        chunked_10mib.extend_from_slice(b"\r\n");
    }
    chunked_10mib.extend_from_slice(b"0\r\n\r\n");
    let huge_header = format!(
        "POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nX-Big: {}\r\nContent-Length: 0\r\n\r\n",
        "h".repeat(100 * 1024)
    );
    let many_headers = {
        let mut r = "POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\n".to_string();
        for i in 0..2000 {
            r.push_str(&format!("X-H{i}: {i}\r\n"));
        }
        r + "Content-Length: 0\r\n\r\n"
    };
    let with_content_type = |ct: &str, body: &[u8]| {
        let mut headers = signed(&Scheme::Stripe, SECRET, body, "", None);
        headers.retain(|(k, _)| k != "content-type");
        headers.push(("Content-Type".into(), ct.into()));
        request("POST", "/webhooks/stripe", &headers, body)
    };
    let std_head = |extra: &str| {
        format!(
            "POST /webhooks/std HTTP/1.1\r\nHost: gate\r\n{extra}Content-Length: 2\r\nConnection: close\r\n\r\n{{}}"
        )
        .into_bytes()
    };

    vec![
        // Signatures.
        gate(
            "no signature",
            request("POST", "/webhooks/stripe", &[], b"{}"),
            400,
            "invalid_signature",
        ),
        gate(
            "forged signature",
            request(
                "POST",
                "/webhooks/stripe",
                &signed(&Scheme::Stripe, "whsec_forged", b"{}", "", None),
                b"{}",
            ),
            400,
            "invalid_signature",
        ),
        gate(
            "garbage signature header",
            request(
                "POST",
                "/webhooks/stripe",
                &[("Stripe-Signature".into(), "t=,v1=,,==;t=x,v1=zz".into())],
                b"{}",
            ),
            400,
            "invalid_signature",
        ),
        gate(
            "stale timestamp",
            request(
                "POST",
                "/webhooks/stripe",
                &signed(&Scheme::Stripe, SECRET, b"{}", "", Some(1_000_000_000)),
                b"{}",
            ),
            400,
            "stale_timestamp",
        ),
        // Bodies (signed, so they reach the key parser).
        gate(
            "invalid UTF-8",
            stripe(b"{\"id\":\"evt_\xff\xfe\"}"),
            400,
            "bad_payload",
        ),
        gate(
            "truncated JSON",
            stripe(b"{\"id\":\"evt_trunc"),
            400,
            "bad_payload",
        ),
        gate("empty body", stripe(b""), 400, "bad_payload"),
        gate("JSON null", stripe(b"null"), 400, "missing_key"),
        gate(
            "id is an object",
            stripe(b"{\"id\":{\"x\":1}}"),
            400,
            "missing_key",
        ),
        gate(
            "NUL in the id",
            stripe(b"{\"id\":\"evt\\u0000x\"}"),
            400,
            "bad_payload",
        ),
        gate(
            "id over 512 bytes",
            stripe(format!("{{\"id\":\"{}\"}}", "i".repeat(600)).as_bytes()),
            400,
            "bad_payload",
        ),
        // Duplicate keys: serde_json keeps the last, as most parsers do; the
        // body is signed, so only the sender could have chosen it.
        gate(
            "duplicate JSON keys",
            stripe(b"{\"id\":\"evt_dup_first\",\"id\":\"evt_dup_last\"}"),
            200,
            "forwarded",
        ),
        gate(
            "nested 100 deep",
            stripe(&deep(100)),
            200,
            "forwarded",
        ),
        gate(
            "nested 100000 deep (recursion limit, no stack overflow)",
            stripe(&deep(100_000)),
            400,
            "bad_payload",
        ),
        gate(
            "10 MiB body with Content-Length",
            stripe(&ten_mib),
            413,
            "payload_too_large",
        ),
        gate(
            "10 MiB chunked body",
            chunked_10mib,
            413,
            "payload_too_large",
        ),
        // Content types: the key source decides the parse, not the header.
        gate(
            "JSON sent as text/plain",
            with_content_type("text/plain", b"{\"id\":\"evt_text_plain\"}"),
            200,
            "forwarded",
        ),
        gate(
            // A key source that does not apply to the content type finds no
            // key (SPEC section 1): Stripe's on_missing_key is reject.
            "form body to a JSON key",
            with_content_type("application/x-www-form-urlencoded", b"id=evt_form"),
            400,
            "missing_key",
        ),
        gate(
            "multipart to a JSON key",
            with_content_type(
                "multipart/form-data; boundary=x",
                b"--x\r\nContent-Disposition: form-data; name=\"id\"\r\n\r\nevt\r\n--x--\r\n",
            ),
            400,
            "missing_key",
        ),
        // Methods.
        gate(
            "GET",
            request("GET", "/webhooks/stripe", &[], b""),
            405,
            "method_not_allowed",
        ),
        gate(
            "PUT",
            request("PUT", "/webhooks/stripe", &[], b"{}"),
            405,
            "method_not_allowed",
        ),
        gate(
            "DELETE",
            request("DELETE", "/webhooks/stripe", &[], b""),
            405,
            "method_not_allowed",
        ),
        gate(
            "PATCH",
            request("PATCH", "/webhooks/stripe", &[], b"{}"),
            405,
            "method_not_allowed",
        ),
        gate(
            "OPTIONS",
            request("OPTIONS", "/webhooks/stripe", &[], b""),
            405,
            "method_not_allowed",
        ),
        gate(
            "unknown method",
            request("BREW", "/webhooks/stripe", &[], b""),
            405,
            "method_not_allowed",
        ),
        // Key headers.
        gate(
            "10 KB webhook-id",
            standard(&"k".repeat(10 * 1024)),
            400,
            "bad_payload",
        ),
        gate(
            "tab in webhook-id",
            standard("msg\tinner"),
            400,
            "bad_payload",
        ),
        refused(
            "bare CR in a key header",
            std_head("webhook-id: msg\rinjected: 1\r\n"),
        ),
        refused(
            "bare LF in a key header",
            std_head("webhook-id: msg\ninjected: 1\r\n"),
        ),
        refused(
            "obsolete line folding in a key header",
            std_head("webhook-id: msg\r\n folded\r\n"),
        ),
        refused(
            "NUL in a key header",
            std_head("webhook-id: msg\0x\r\n"),
        ),
        // Framing.
        refused("a 100 KB header", huge_header.into_bytes()),
        refused("2000 headers", many_headers.into_bytes()),
        refused(
            "chunk size not hex",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n".to_vec(),
        ),
        refused(
            "chunk shorter than announced, then EOF",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\n100\r\nabc".to_vec(),
        ),
        refused(
            "chunk size overflowing 64 bits",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nabc\r\n0\r\n\r\n".to_vec(),
        ),
        refused(
            "Content-Length and chunked together",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n".to_vec(),
        ),
        refused(
            "two different Content-Lengths",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}".to_vec(),
        ),
        refused(
            "body shorter than Content-Length, then EOF",
            b"POST /webhooks/stripe HTTP/1.1\r\nHost: gate\r\nContent-Length: 100\r\n\r\n{}".to_vec(),
        ),
        refused(
            "garbage request line",
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 not http\r\n\r\n".to_vec(),
        ),
        refused(
            "HTTP/0.9-style request",
            b"POST /webhooks/stripe\r\n\r\n".to_vec(),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_get_their_4xx_and_the_gate_keeps_serving() {
    let up = Upstream::start().await;
    let config = GateFixture::stripe()
        .add_provider("std", Scheme::Standard)
        .secret(STD_SECRET)
        .server_extra("read_timeout = \"2s\"")
        .upstream(&up);
    let path = config.config_file();
    let (child, addr) = tokio::task::spawn_blocking(move || Child::spawn(&path))
        .await
        .unwrap();
    let pid = child.pid();

    let table = cases();
    let tried = table.len();
    let before = rss_kib(pid);
    let mut peak = before;
    let mut failures = Vec::new();
    // Twice over: the second round shows nothing was left behind by the first.
    for round in 0..2 {
        for case in cases() {
            let Case {
                name,
                request,
                expect,
            } = case;
            let started = Instant::now();
            let got = tokio::task::spawn_blocking(move || exchange(addr, request))
                .await
                .unwrap();
            let ok = match (&expect, &got) {
                (Expect::Gate(status, code), Some((s, r))) => {
                    s == status && (r == code || (round == 1 && r == "duplicate"))
                }
                (Expect::Refused, None) => true,
                (Expect::Refused, Some((s, _))) => (400..500).contains(s),
                (Expect::Gate(..), None) => false,
            };
            if round == 0 {
                println!("malformed: {name}: {got:?}");
            }
            if !ok {
                failures.push(format!("{name}: expected {expect:?}, got {got:?}"));
            }
            assert!(
                started.elapsed() < Duration::from_secs(12),
                "{name} took {:?}",
                started.elapsed()
            );
            peak = peak.max(rss_kib(pid));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Still serving: a valid delivery is forwarded, byte for byte.
    let body = stripe_event("evt_after_the_storm");
    let answer = tokio::task::spawn_blocking(move || exchange(addr, stripe(&body)))
        .await
        .unwrap();
    assert_eq!(answer, Some((200, "forwarded".into())));
    let forwarded_ids: Vec<String> = up
        .received()
        .iter()
        .filter_map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).ok())
        .filter_map(|v| v["id"].as_str().map(str::to_owned))
        .collect();
    assert!(forwarded_ids.contains(&"evt_after_the_storm".to_owned()));
    assert!(
        forwarded_ids.contains(&"evt_dup_last".to_owned()),
        "{forwarded_ids:?}"
    );

    // Bounded memory: 2 x 10 MiB bodies twice over did not pile up (the
    // limit is 1 MiB and nothing is buffered past it).
    let after = rss_kib(pid);
    println!(
        "malformed: {tried} cases x 2 rounds; rss {before} KiB -> peak {peak} KiB -> {after} KiB"
    );
    assert!(
        peak < before + 64 * 1024,
        "rss grew from {before} KiB to {peak} KiB"
    );
    let (code, lines) = tokio::task::spawn_blocking(move || child.stop())
        .await
        .unwrap();
    assert_eq!(code, Some(0), "{}", lines.join("\n"));
    assert!(
        !lines.iter().any(|l| l.contains("panicked")),
        "{}",
        lines.join("\n")
    );
}
