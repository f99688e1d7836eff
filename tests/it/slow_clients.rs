//! Clients that hold a connection, or the gate's memory, without using
//! it: silent, pinging, not reading their answers, or sending large bodies
//! slowly. Each is let go or bounded, and a slow reader is not taken for
//! one (README, `server.read_timeout`, `server.max_body_bytes_in_flight`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::support::fixture::{Gate, GateFixture, StoreConfig};
use crate::support::gate::{raw_head, stripe_event};
use crate::support::http2::{http2_connection, signed_request};
use crate::support::upstream::Behavior;

/// hyper's HTTP/2 server times nothing: a client that sent one request and
/// then stays silent must not hold its connection slot until shutdown. It
/// is shut down (GOAWAY) once it has sent nothing for `server.read_timeout`.
#[tokio::test]
async fn an_idle_http2_connection_is_closed_after_the_read_timeout() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let (mut send, conn) = http2_connection(&gate).await;
    let opened = Instant::now();
    let body = stripe_event("evt_h2_idle");
    let response = send
        .send_request(signed_request(&gate, &body))
        .await
        .unwrap();
    assert_eq!(response.headers()["hookgate-result"], "forwarded");
    let _ = response.into_body().collect().await.unwrap();

    // Silent from here on: the gate ends the connection, the client's side
    // of it then completes.
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(ended.is_ok(), "the idle connection was kept open");
    let kept = opened.elapsed();
    assert!(
        kept >= Duration::from_millis(800),
        "closed after {kept:?}, before the read timeout"
    );
    gate.shutdown().await;
}

/// PINGs are no requests: a client that pings every 300 ms (which the gate
/// answers) but asks nothing is closed like a silent one.
#[tokio::test]
async fn an_http2_connection_that_only_pings_is_closed() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let tcp = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .timer(hyper_util::rt::TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(300))
        .keep_alive_while_idle(true)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let body = stripe_event("evt_h2_pings");
    let response = send
        .send_request(signed_request(&gate, &body))
        .await
        .unwrap();
    let _ = response.into_body().collect().await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), conn).await;
    assert!(
        ended.is_ok(),
        "a connection kept alive by PINGs alone stayed open"
    );
    gate.shutdown().await;
}

/// An HTTP/2 connection is idle only with no stream open: a request the
/// app takes longer than four `read_timeout`s to answer (past a GOAWAY and
/// the drop two periods after it, were the stream not counted) still gets
/// its answer.
#[tokio::test]
async fn an_http2_request_in_flight_outlasts_the_idle_timeout() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .upstream_timeout("6s")
        .store(StoreConfig::sqlite().lease("8s"))
        .start()
        .await;
    gate.upstream()
        .set(Behavior::Stall(Duration::from_millis(4500)));
    let (mut send, _conn) = http2_connection(&gate).await;
    let body = stripe_event("evt_h2_slow");
    let response = send.send_request(signed_request(&gate, &body)).await;
    let response = response.expect("the answer, after 2.5 s with nothing else asked");
    assert_eq!(response.headers()["hookgate-result"], "forwarded");
    let _ = response.into_body().collect().await.unwrap();
    gate.shutdown().await;
}

/// A client that reads none of its answers (here: a window of zero, never
/// opened) holds its streams open; it is dropped once they have waited on
/// it, asking for nothing, for two read timeouts.
#[tokio::test]
async fn an_http2_client_that_reads_nothing_is_dropped() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let tcp = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let body = stripe_event("evt_h2_unread");
    let response = send
        .send_request(signed_request(&gate, &body))
        .await
        .unwrap();
    assert_eq!(response.headers()["hookgate-result"], "forwarded");
    // The head came (not flow-controlled); the body is never read.
    let held = response;
    let ended = tokio::time::timeout(Duration::from_secs(15), conn).await;
    assert!(
        ended.is_ok(),
        "a client that reads nothing kept its connection"
    );
    drop(held);
    gate.shutdown().await;
}

/// A client that reads slowly is not one that reads nothing: a 1 MB answer
/// read 64 KiB at a time over more than three read timeouts arrives whole,
/// streamed (passthrough) or buffered (a delivery's forwarded answer).
#[tokio::test]
async fn an_http2_client_that_reads_slowly_gets_its_whole_answer() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    gate.upstream().set(Behavior::Large {
        status: 200,
        bytes: 1 << 20,
    });
    // Origin-form targets, as an HTTP/1 client sends them.
    let download = http::Request::get("/download")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let delivery = signed_request(&gate, &stripe_event("evt_h2_large"));
    for request in [download, delivery] {
        let path = request.uri().path().to_owned();
        let started = Instant::now();
        assert_eq!(read_slowly(&gate, request).await, 1 << 20, "{path}");
        assert!(
            started.elapsed() > Duration::from_secs(3),
            "{path}: read over more than three read timeouts"
        );
    }
    gate.shutdown().await;
}

/// Sends `request` on a connection of its own with 64 KiB windows and reads
/// the answer 64 KiB every 300 ms: the bytes that came.
async fn read_slowly(gate: &Gate, request: http::Request<Full<Bytes>>) -> usize {
    let tcp = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut body = send.send_request(request).await.unwrap().into_body();
    let (mut got, mut since_pause) = (0, 0);
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the answer arrives whole, not cut off");
        let n = frame.data_ref().map_or(0, Bytes::len);
        got += n;
        since_pause += n;
        if since_pause >= 65_535 {
            since_pause = 0;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    got
}

/// An answer the app gives in full at once: the most of one the gate holds
/// for a delivery, and far more than the kernel holds between the gate and
/// a client that reads nothing (the gate's socket holds 128 KiB unsent, the
/// client's receive buffer is set small), so the gate's writes wait on the
/// client.
const LARGE: usize = 8 << 20;

/// An HTTP/1 connection to the gate with a 16 KiB receive buffer, driven
/// by a task of its own: hyper reads from it only as its body is read.
async fn http1_connection(gate: &Gate) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let socket = if gate.addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .unwrap();
    socket.set_recv_buffer_size(16 * 1024).unwrap();
    let tcp = socket.connect(gate.addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// A passthrough download (streamed from the app) and a delivery (whose
/// answer the gate holds whole), each asking for `LARGE` bytes.
fn large_answers(gate: &Gate) -> [http::Request<Full<Bytes>>; 2] {
    gate.upstream().set(Behavior::Large {
        status: 200,
        bytes: LARGE,
    });
    // Origin-form targets, as an HTTP/1 client sends them.
    let download = http::Request::get("/download")
        .header("host", gate.addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mut delivery = signed_request(gate, &stripe_event("evt_h1_large"));
    *delivery.uri_mut() = gate.path().parse().unwrap();
    delivery
        .headers_mut()
        .insert("host", gate.addr.to_string().parse().unwrap());
    [download, delivery]
}

/// hyper's HTTP/1 server has no write timeout: a client that asks for a
/// large answer and reads none of it would hold its connection slot (and
/// the answer) for as long as TCP keeps the connection. A write that waits
/// two read timeouts on the client ends the connection.
#[tokio::test]
async fn an_http1_client_that_reads_nothing_is_dropped() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let reads = large_answers(&gate).map(|request| async {
        let path = request.uri().path().to_owned();
        let mut send = http1_connection(&gate).await;
        let response = send.send_request(request).await.expect("the answer's head");
        assert_eq!(response.status(), 200, "{path}");
        // Nothing read for two and a half times what a write may wait.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let got = response.into_body().collect().await;
        let Err(error) = got else {
            panic!("{path}: the whole answer waited 5 s for a client that read none of it");
        };
        assert!(
            crate::support::is_reset(&error),
            "{path}: closed without a reset, leaving the rest queued: {error:?}"
        );
    });
    futures_util::future::join_all(reads).await;
    gate.shutdown().await;
}

/// The HTTP/1 write timeout is judged per write, not per answer: a client
/// that reads a large answer 512 KiB every 250 ms, for longer than a write
/// may wait, gets it whole.
#[tokio::test]
async fn an_http1_client_that_reads_slowly_gets_its_whole_answer() {
    let gate = GateFixture::stripe()
        .server_extra("read_timeout = \"1s\"")
        .start()
        .await;
    let reads = large_answers(&gate).map(|request| async {
        let path = request.uri().path().to_owned();
        let started = Instant::now();
        let mut send = http1_connection(&gate).await;
        let response = send.send_request(request).await.expect("the answer's head");
        let mut body = response.into_body();
        let (mut got, mut since_pause) = (0, 0);
        while let Some(frame) = body.frame().await {
            let frame = frame.unwrap_or_else(|e| panic!("{path}: cut off after {got} bytes: {e}"));
            let n = frame.data_ref().map_or(0, Bytes::len);
            got += n;
            since_pause += n;
            if since_pause >= 512 << 10 {
                since_pause = 0;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
        assert_eq!(got, LARGE, "{path}");
        assert!(
            started.elapsed() > Duration::from_secs(3),
            "{path}: read over longer than a write may wait"
        );
    });
    futures_util::future::join_all(reads).await;
    gate.shutdown().await;
}

/// Bodies being read are held in memory: over every connection together
/// they may take `server.max_body_bytes_in_flight`, counted as their bytes
/// come. A delivery the budget has no room for is refused at once (503
/// `overloaded`, `Retry-After`), and the budget comes back when the
/// senders leave, not at their read timeout.
#[tokio::test]
async fn bodies_in_flight_over_every_connection_are_bounded() {
    use tokio::io::AsyncWriteExt;
    let gate = GateFixture::stripe()
        .server_extra(
            "max_body_bytes = \"64KiB\"\nmax_body_bytes_in_flight = \"136KiB\"\nread_timeout = \"30s\"",
        )
        .start()
        .await;
    let path = gate.path();
    // Each sends a byte less than 64 KiB and does not end its body: one
    // declared 64 KiB, the other sends chunks without a length.
    let mut declared = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let head = raw_head(&path, "", &[], 64 * 1024);
    declared.write_all(head.as_bytes()).await.unwrap();
    declared.write_all(&[b' '; 64 * 1024 - 1]).await.unwrap();
    let mut chunked = tokio::net::TcpStream::connect(gate.addr).await.unwrap();
    let head = format!("POST {path} HTTP/1.1\r\nhost: gate\r\ntransfer-encoding: chunked\r\n\r\n");
    chunked.write_all(head.as_bytes()).await.unwrap();
    for size in [16 * 1024, 16 * 1024, 16 * 1024, 16 * 1024 - 1] {
        let chunk = format!("{size:x}\r\n{}\r\n", "x".repeat(size));
        chunked.write_all(chunk.as_bytes()).await.unwrap();
    }
    // 128 KiB held once the gate has read both (their heads with them): a
    // 16 KiB delivery does not fit, is refused, and does not reach the app.
    // The gate is given time to read both first: a delivery read meanwhile
    // could take the room one of them needs, which would then be refused.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut refused = None;
    for n in 0..10 {
        let answer = gate.deliver(large_event(n, 16).as_bytes()).await;
        if answer.status == 503 {
            refused = Some((n, answer));
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (name, sender) in [("declared", &declared), ("chunked", &chunked)] {
        let mut answer = [0; 64];
        let answered = sender.try_read(&mut answer);
        assert!(
            matches!(&answered, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the {name} sender was answered: {answered:?}"
        );
    }
    let (n, refused) = refused.expect("a 16 KiB delivery refused with 128 KiB of bodies held");
    assert_eq!(refused.result(), "overloaded");
    assert_eq!(refused.json()["error"], "overloaded");
    assert_eq!(refused.headers["retry-after"], "1");
    let at_app = gate.upstream().received();
    assert!(
        at_app
            .iter()
            .all(|r| r.body.as_ref() != large_event(n, 16).as_bytes())
    );
    // A small one still fits.
    let small = gate.deliver(&stripe_event("evt_budget_small")).await;
    assert_eq!(small.result(), "forwarded");

    // The two senders leave: their share comes back at once (the read
    // timeout is 30 s), and the large delivery goes through.
    drop((declared, chunked));
    let started = Instant::now();
    let mut answer = gate.deliver(large_event(n, 16).as_bytes()).await;
    while answer.status == 503 && started.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer = gate.deliver(large_event(n, 16).as_bytes()).await;
    }
    assert_eq!(answer.result(), "forwarded");
    gate.shutdown().await;
}

/// A body stays counted while its bytes are held after the read: here
/// until the app, which takes 5 s, has answered its delivery.
#[tokio::test]
async fn a_body_is_counted_until_its_delivery_is_done() {
    let gate = GateFixture::stripe()
        .server_extra("max_body_bytes = \"64KiB\"\nmax_body_bytes_in_flight = \"64KiB\"")
        .upstream_timeout("8s")
        .store(StoreConfig::sqlite().lease("12s"))
        .start()
        .await;
    let up = gate.upstream();
    up.set(Behavior::Stall(Duration::from_secs(5)));
    let first = large_event(1, 40);
    let second = large_event(2, 40);
    let (first_answer, second_answer) = tokio::join!(gate.deliver(first.as_bytes()), async {
        crate::support::wait::until("the app has the first delivery", || up.count() == 1).await;
        gate.deliver(second.as_bytes()).await
    });
    assert_eq!(first_answer.result(), "forwarded");
    assert_eq!(
        second_answer.result(),
        "overloaded",
        "40 KiB more while the first 40 KiB waited on the app"
    );
    let again = gate.deliver(second.as_bytes()).await;
    assert_eq!(again.result(), "forwarded", "its share came back");
    gate.shutdown().await;
}

/// A Stripe event of about `kib` KiB, with id `evt_budget{n}`.
fn large_event(n: usize, kib: usize) -> String {
    format!(
        r#"{{"id":"evt_budget{n}","object":"event","pad":"{}"}}"#,
        "p".repeat(kib * 1024)
    )
}
