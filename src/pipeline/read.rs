//! Stage 2, read: the raw body, at most `server.max_body_bytes`, within
//! `server.read_timeout`. The bytes are kept exactly: they are what is
//! verified and what is forwarded.

use bytes::Bytes;
use http::{HeaderValue, Uri, header, request};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::budget::{BodyBudget, Share};
use crate::error::GateError;
use crate::settings::ServerSettings;

/// A delivery as read: its head and its raw body, both off hyper's buffers.
/// The buffer that holds them (the head's values and path, then the body)
/// carries the request's share of `server.max_body_bytes_in_flight`
/// (`unshare`).
pub struct Request {
    pub head: request::Parts,
    pub body: Bytes,
}

/// Reads the whole body. A declared length over the limit is refused before
/// a byte is read; a body that grows past it is cut off as soon as it does.
/// One the budget has no room for is refused (`overloaded`) as soon as the
/// bytes that came pass it: a declared length is not reserved, since a
/// sender need not send what it declares.
pub async fn read(
    server: &ServerSettings,
    budget: &BodyBudget,
    mut head: request::Parts,
    incoming: Incoming,
) -> Result<Request, GateError> {
    let limit = server.max_body_bytes;
    let declared = head
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GateError::PayloadTooLarge { limit });
    }
    let mut share = Share::default();
    let read = collect(&head, incoming, declared, limit, budget, &mut share);
    let buf = match tokio::time::timeout(server.read_timeout, read).await {
        Err(_) => return Err(GateError::RequestTimeout),
        Ok(buf) => buf?,
    };
    let body = unshare(&mut head, buf, share);
    Ok(Request { head, body })
}

/// The request's bytes as `unshare` takes them: the head's values and path,
/// then the body's frames, copied as they come (so that no frame holds
/// hyper's read buffer), at most `limit` bytes of body. The buffer's size
/// is counted in `share` as it grows. Trailers (HTTP/2, chunked HTTP/1) are
/// not part of the body.
async fn collect(
    head: &request::Parts,
    mut incoming: Incoming,
    declared: Option<u64>,
    limit: u64,
    budget: &BodyBudget,
    share: &mut Share,
) -> Result<Vec<u8>, GateError> {
    let mut buf = Vec::new();
    // The most the head and the body together may reach in `buf`.
    let mut ceiling = 0;
    let mut total: u64 = 0;
    while let Some(frame) = incoming.frame().await {
        let frame =
            frame.map_err(|e| GateError::BadPayload(format!("body could not be read: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total = total.saturating_add(data.len() as u64);
        if total > limit {
            return Err(GateError::PayloadTooLarge { limit });
        }
        if buf.is_empty() {
            // The first frame: the head goes in first, with room for this
            // frame (a webhook's body nearly always is one). Counted
            // before it is allocated.
            let head_len = head_bytes(head);
            budget.hold(share, (head_len + data.len()) as u64)?;
            buf = start(head, head_len + data.len());
            let most = usize::try_from(declared.unwrap_or(limit)).unwrap_or(usize::MAX);
            ceiling = head_len.saturating_add(most);
        } else if let Some(room) = grown(buf.len(), buf.capacity(), data.len(), ceiling) {
            budget.hold(share, room as u64)?;
            buf.reserve_exact(room - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    if buf.is_empty() {
        let head_len = head_bytes(head);
        budget.hold(share, head_len as u64)?;
        buf = start(head, head_len);
    }
    Ok(buf)
}

/// The capacity a buffer of `len` bytes in `capacity` needs for `more`
/// bytes, if it has too little: doubled, as a vector grows (a body in many
/// frames is not copied over and over), but not past `ceiling`, the most
/// the head and body may reach (the body's declared length, or the limit),
/// so that what the budget counts stays near what came.
fn grown(len: usize, capacity: usize, more: usize, ceiling: usize) -> Option<usize> {
    let needed = len + more;
    (needed > capacity).then(|| capacity.saturating_mul(2).min(ceiling).max(needed))
}

/// How many bytes `start` copies: the head's values and its path.
fn head_bytes(head: &request::Parts) -> usize {
    let values: usize = head.headers.values().map(HeaderValue::len).sum();
    values + own_path(head).map_or(0, str::len)
}

/// A buffer of `capacity` bytes (as counted) holding the head's values and
/// its path (`unshare`'s order), the body to follow.
fn start(head: &request::Parts, capacity: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(capacity);
    for value in head.headers.values() {
        buf.extend_from_slice(value.as_bytes());
    }
    if let Some(path) = own_path(head) {
        buf.extend_from_slice(path.as_bytes());
    }
    buf
}

/// The path (with its query) that `unshare` moves, if it is one: not an
/// absolute-form target's.
fn own_path(head: &request::Parts) -> Option<&str> {
    head.uri
        .path_and_query()
        .filter(|_| head.uri.authority().is_none())
        .map(|pq| pq.as_str())
}

/// Moves the request head and body off hyper's read buffer. hyper parses
/// header values and the path as slices of that buffer (8 KiB or more per
/// connection) and hands a small body out the same way; held for the whole
/// delivery they keep it alive, so that hyper's next read into it (the next
/// request's head, or HTTP/2's next frames) allocates another. Copying the
/// few hundred bytes of a webhook lets it reuse the first. One allocation
/// holds them all (`buf`, as `start` began it, then the body), so the
/// head's values stay cheap to clone (a reference count) when the request
/// is forwarded; the body is what follows them.
///
/// That allocation owns the request's `share` of the budget: the share is
/// given back when the last reference to the bytes is dropped, wherever
/// they went (the request to the app, an outbox job waiting on the store's
/// thread), not when the delivery's stages end.
pub fn unshare(head: &mut request::Parts, buf: Vec<u8>, share: Share) -> Bytes {
    let path_len = own_path(head).map(str::len);
    let mut owned = Bytes::from_owner(Owned { buf, _share: share });
    for value in head.headers.values_mut() {
        let copy = owned.split_to(value.len());
        let sensitive = value.is_sensitive();
        if let Ok(mut copied) = HeaderValue::from_maybe_shared(copy) {
            copied.set_sensitive(sensitive);
            *value = copied;
        }
    }
    if let Some(len) = path_len
        && let Ok(uri) = Uri::from_maybe_shared(owned.split_to(len))
    {
        head.uri = uri;
    }
    owned
}

/// A request's bytes and the body's share of the budget, freed together.
struct Owned {
    buf: Vec<u8>,
    _share: Share,
}

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_grows_by_doubling_up_to_the_most_the_body_may_reach() {
        assert_eq!(grown(10, 16, 6, 100), None, "room enough");
        assert_eq!(grown(10, 16, 7, 100), Some(32));
        assert_eq!(grown(60, 64, 30, 100), Some(100), "not past the ceiling");
        assert_eq!(grown(10, 16, 50, 100), Some(60), "at least what is needed");
        assert_eq!(
            grown(usize::MAX / 2 + 1, usize::MAX / 2 + 1, 1, usize::MAX),
            Some(usize::MAX)
        );
    }

    /// Several values, one name twice, an empty body: each value, the path
    /// and the body come back as they were, from one buffer.
    #[test]
    fn unshare_splits_every_value_in_order() {
        let req = http::Request::post("/hooks/x?a=1")
            .header("x-one", "first")
            .header("x-two", "second")
            .header("x-one", "again")
            .body(())
            .unwrap();
        let (mut head, ()) = req.into_parts();
        let before: Vec<_> = head
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let buf = start(&head, head_bytes(&head));
        assert_eq!(buf.len(), head_bytes(&head));
        assert_eq!(buf.capacity(), buf.len(), "no more than is counted");
        let body = unshare(&mut head, buf, Share::default());
        assert!(body.is_empty());
        let after: Vec<_> = head
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(after, before);
        assert_eq!(head.uri, "/hooks/x?a=1");
    }

    #[test]
    fn unshare_keeps_every_byte_but_not_the_buffer() {
        // A head whose values live in one shared buffer, as hyper parses them.
        let buffer = Bytes::from_static(b"prefix t=1,v1=ab\x80cd /hooks/x?attempt=2");
        let inside = |p: *const u8| buffer.as_ptr_range().contains(&p);
        let signature = HeaderValue::from_maybe_shared(buffer.slice(7..19)).unwrap();
        let mut req = http::Request::post(Uri::from_maybe_shared(buffer.slice(20..)).unwrap())
            .header("stripe-signature", signature)
            .body(())
            .unwrap();
        req.headers_mut()
            .get_mut("stripe-signature")
            .unwrap()
            .set_sensitive(true);
        let (mut head, ()) = req.into_parts();
        assert!(inside(head.headers["stripe-signature"].as_bytes().as_ptr()));

        let mut buf = start(&head, head_bytes(&head) + 6);
        buf.extend_from_slice(&buffer[..6]);
        let body = unshare(&mut head, buf, Share::default());

        let value = &head.headers["stripe-signature"];
        assert_eq!(value.as_bytes(), b"t=1,v1=ab\x80cd");
        assert!(value.is_sensitive());
        assert!(!inside(value.as_bytes().as_ptr()));
        assert_eq!(head.uri, "/hooks/x?attempt=2");
        let path = head.uri.path_and_query().unwrap().as_str().as_ptr();
        assert!(!inside(path));
        assert_eq!(body, "prefix");
        assert!(!inside(body.as_ptr()));
    }
}
