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
/// The buffer that holds them carries the body's share of
/// `server.max_body_bytes_in_flight` (`unshare`).
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
    let read = collect(incoming, limit, budget, &mut share);
    let frames = match tokio::time::timeout(server.read_timeout, read).await {
        Err(_) => return Err(GateError::RequestTimeout),
        Ok(frames) => frames?,
    };
    let body = unshare(&mut head, frames.iter(), share);
    Ok(Request { head, body })
}

/// A body's frames as they came; nearly always one.
#[derive(Default)]
struct Frames {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Frames {
    fn push(&mut self, data: Bytes) {
        if self.first.is_none() {
            self.first = Some(data);
        } else {
            self.rest.push(data);
        }
    }

    fn iter(&self) -> impl Iterator<Item = &Bytes> + Clone {
        self.first.iter().chain(&self.rest)
    }
}

/// The body's frames, at most `limit` bytes, each counted in `share` as it
/// comes. Trailers (HTTP/2, chunked HTTP/1) are not part of the body.
async fn collect(
    mut incoming: Incoming,
    limit: u64,
    budget: &BodyBudget,
    share: &mut Share,
) -> Result<Frames, GateError> {
    let mut frames = Frames::default();
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
        budget.hold(share, total)?;
        frames.push(data);
    }
    Ok(frames)
}

/// Moves the request head and body off hyper's read buffer. hyper parses
/// header values and the path as slices of that buffer (8 KiB or more per
/// connection) and hands a small body out the same way; held for the whole
/// delivery they keep it alive, so that hyper's next read into it (the next
/// request's head, or HTTP/2's next frames) allocates another. Copying the
/// few hundred bytes of a webhook lets it reuse the first. One allocation
/// holds them all, so the head's values stay cheap to clone (a reference
/// count) when the request is forwarded.
///
/// That allocation owns the body's `share` of the budget: the share is
/// given back when the last reference to the bytes is dropped, wherever
/// they went (the request to the app, an outbox job waiting on the store's
/// thread), not when the delivery's stages end.
pub fn unshare<'a>(
    head: &mut request::Parts,
    body: impl Iterator<Item = &'a Bytes> + Clone,
    share: Share,
) -> Bytes {
    let path = head
        .uri
        .path_and_query()
        .filter(|_| head.uri.authority().is_none())
        .map(|pq| pq.as_str());
    let head_len: usize = head.headers.values().map(HeaderValue::len).sum();
    let path_len = path.map_or(0, str::len);
    let body_len: usize = body.clone().map(Bytes::len).sum();
    let mut buf = Vec::with_capacity(head_len + path_len + body_len);
    for value in head.headers.values() {
        buf.extend_from_slice(value.as_bytes());
    }
    let has_path = path.is_some();
    if let Some(path) = path {
        buf.extend_from_slice(path.as_bytes());
    }
    for frame in body {
        buf.extend_from_slice(frame);
    }
    let mut owned = Bytes::from_owner(Owned { buf, _share: share });
    for value in head.headers.values_mut() {
        let copy = owned.split_to(value.len());
        let sensitive = value.is_sensitive();
        if let Ok(mut copied) = HeaderValue::from_maybe_shared(copy) {
            copied.set_sensitive(sensitive);
            *value = copied;
        }
    }
    let path_copy = owned.split_to(path_len);
    if has_path && let Ok(uri) = Uri::from_maybe_shared(path_copy) {
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

        let body = unshare(&mut head, [buffer.slice(..6)].iter(), Share::default());

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
