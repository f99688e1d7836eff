//! Entry points shared by the cargo-fuzz targets (`fuzz/`) and the corpus
//! replay test (`tests/it/fuzz_corpus.rs`): each takes arbitrary bytes,
//! drives one parser of untrusted input, and panics only when an invariant
//! breaks. Not part of the gate's API.
//!
//! Input layout for the signature targets: header values, one per line, in
//! the order of the scheme's header names, then a NUL byte, then the body.
//! A line that is not a valid header value leaves that header out.

use std::collections::BTreeMap;
use std::sync::Arc;

use figment::Figment;
use figment::providers::Serialized;
use figment::value::Value;
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use sha2::{Digest, Sha256};

use crate::key::{KeyPart, KeySource, Payload};
use crate::provider::{
    Algorithm, Delivery, Encoding, HmacScheme, Scheme, Template, TwilioScheme, Verified,
    VerifyError,
};
use crate::secret::{ActiveSecret, SecretValue};
use crate::settings::FingerprintMode;

/// One fuzz target: its name (of `fuzz/fuzz_targets/*.rs` and of its corpus
/// folder) and what it runs.
pub type Target = (&'static str, fn(&[u8]));

/// Every fuzz target.
pub const TARGETS: &[Target] = &[
    ("stripe_signature", stripe_signature),
    ("standard_signature", standard_signature),
    ("twilio_signature", twilio_signature),
    ("sendgrid_signature", sendgrid_signature),
    ("github_signature", github_signature),
    ("slack_signature", slack_signature),
    ("shopify_signature", shopify_signature),
    ("hmac_signature", hmac_signature),
    ("key_extraction", key_extraction),
    ("fingerprint", fingerprint),
    ("config", config),
    ("path_normalization", path_normalization),
];

/// Routing's path normalization (`crate::route`), on any path text.
///
/// Invariants: the canonical form is absolute, has no empty, `.` or `..`
/// segment and no `;`, and is its own canonical form; a path and its
/// canonical form route alike; routing never panics, and a path that routes
/// to a provider has the provider's canonical path (case folded).
pub fn path_normalization(data: &[u8]) {
    use crate::route::{Route, RouteSpec, Routes, canonical, lenient};
    let text = String::from_utf8_lossy(data);
    let routes = Routes::new(
        "/api",
        [
            RouteSpec {
                path: "/webhooks/stripe",
                upstream_path: None,
                case_sensitive: false,
            },
            RouteSpec {
                path: "/hooks/Exact.v1/",
                upstream_path: Some("/internal/exact"),
                case_sensitive: true,
            },
        ],
    );
    let route = routes.route(&text);
    let _ = lenient(&text, true);
    let _ = lenient(&text, false);
    if let Ok(canon) = canonical(&text) {
        assert!(canon.starts_with('/'), "{canon:?}");
        assert!(!canon.contains(';'), "{canon:?}");
        if canon != "/" {
            for segment in canon[1..].split('/') {
                assert!(
                    !matches!(segment, "" | "." | ".."),
                    "{canon:?} from {text:?}"
                );
            }
        }
        assert_eq!(
            canonical(&canon).as_deref(),
            Ok(canon.as_str()),
            "not idempotent"
        );
        if let Route::Provider(i) = route {
            assert_eq!(routes.route(&canon), Route::Provider(i), "{text:?}");
        }
        if route == Route::Provider(0) {
            assert_eq!(canon.to_ascii_lowercase(), "/webhooks/stripe");
        }
    }
}

/// A P-256 verification key (SendGrid's documentation example).
const SENDGRID_PUBLIC_KEY: &str = "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE83T4O/n84iotIvIW4mdBgQ/7dAfSmpqIM8kF9mN1flpVKS3GRqe62gw+2fNNRaINXvVpiglSI8eNEc6wEA3F+g==";

/// `Stripe-Signature` parsing and verification.
pub fn stripe_signature(data: &[u8]) {
    verify(&Scheme::Stripe, &["stripe-signature"], data, b"whsec_fuzz");
}

/// Standard Webhooks (and the `svix-*` aliases).
pub fn standard_signature(data: &[u8]) {
    verify(
        &Scheme::Standard,
        &[
            "webhook-id",
            "webhook-timestamp",
            "webhook-signature",
            "svix-id",
            "svix-timestamp",
            "svix-signature",
        ],
        data,
        b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    );
}

/// Twilio: the signature, the content type and the request target (the
/// third line, which carries the query with `bodySHA256`), form bodies.
pub fn twilio_signature(data: &[u8]) {
    let scheme = Scheme::Twilio(TwilioScheme {
        public_url: "https://example.com:443/webhooks/twilio".into(),
    });
    verify(
        &scheme,
        &["x-twilio-signature", "content-type", ":path"],
        data,
        b"twilio_auth_token",
    );
}

/// SendGrid: base64 DER ECDSA signatures and the timestamp.
pub fn sendgrid_signature(data: &[u8]) {
    verify(
        &Scheme::Sendgrid,
        &[
            "x-twilio-email-event-webhook-signature",
            "x-twilio-email-event-webhook-timestamp",
        ],
        data,
        SENDGRID_PUBLIC_KEY.as_bytes(),
    );
}

/// GitHub: `X-Hub-Signature-256`. The secret is the official vector's, so
/// that a seed can carry a signature that verifies.
pub fn github_signature(data: &[u8]) {
    let secret = b"mysecret";
    verify(&Scheme::Github, &["x-hub-signature-256"], data, secret);
    round_trip(&Scheme::Github, secret, body_of(data));
}

/// Slack: `v0=` hex signature and the signed timestamp.
pub fn slack_signature(data: &[u8]) {
    let secret = b"8f742231b10e8888abcd99yyyzzz85a5";
    let names = ["x-slack-signature", "x-slack-request-timestamp"];
    verify(&Scheme::Slack, &names, data, secret);
    round_trip(&Scheme::Slack, secret, body_of(data));
}

/// Shopify: base64 signature under either header name (the classic one
/// first).
pub fn shopify_signature(data: &[u8]) {
    let secret = b"test_secret_key";
    let names = ["x-shopify-hmac-sha256", "shopify-hmac-sha256"];
    verify(&Scheme::Shopify, &names, data, secret);
    round_trip(&Scheme::Shopify, secret, body_of(data));
}

/// The generic `hmac` scheme, whose shape comes from the input too: the
/// first line is `<encoding> <algorithm> <prefix> <signed_payload>`, such as
/// `hex sha256 sha256= {timestamp}.{body}` (an empty prefix is two spaces);
/// the rest is the usual layout, with the `x-signature` header and then
/// `x-timestamp`, which is configured when the template signs
/// `{timestamp}`, as config validation requires.
pub fn hmac_signature(data: &[u8]) {
    let (shape, rest) = split_line(data);
    let shape = String::from_utf8_lossy(shape);
    let mut words = shape.splitn(4, ' ');
    let encoding = match words.next() {
        Some("hex") => Encoding::Hex,
        Some("base64") => Encoding::Base64,
        _ => return,
    };
    let algorithm = match words.next() {
        Some("sha1") => Algorithm::Sha1,
        Some("sha256") => Algorithm::Sha256,
        Some("sha512") => Algorithm::Sha512,
        _ => return,
    };
    let (Some(prefix), Some(template)) = (words.next(), words.next()) else {
        return;
    };
    let template = match Template::parse(template) {
        Ok(template) => template,
        Err(e) => {
            assert!(!e.is_empty());
            return;
        }
    };
    let signs_timestamp = template.uses_timestamp();
    let scheme = Scheme::Hmac(HmacScheme {
        header: HeaderName::from_static("x-signature"),
        prefix: prefix.to_owned(),
        encoding,
        algorithm,
        timestamp_header: signs_timestamp.then(|| HeaderName::from_static("x-timestamp")),
        template,
    });
    let secret = b"acme-secret";
    if let Some(verified) = verify(&scheme, &["x-signature", "x-timestamp"], rest, secret) {
        assert_eq!(verified.timestamp.is_some(), signs_timestamp);
    }
    // Only a prefix of visible ASCII survives `HeaderValue::to_str`; config
    // validation does not ask for that, so other prefixes are not checked.
    if prefix.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        round_trip(&scheme, secret, body_of(rest));
    }
}

/// The config parser: the input is TOML text (invalid UTF-8 replaced), read
/// and validated by `config::load` as `hookgate check` and startup do.
///
/// Invariants: it loads, or reports at least one issue and each with a
/// message; a config that loads has what the gate needs to route (a path
/// starting with `/` and at least one secret source per provider, no two
/// providers on one path, a lease longer than the upstream timeout); and no
/// issue echoes a secret. For the last, every string under
/// `providers.*.secrets` (`not_after` aside) and the password of `store.url`
/// are replaced with a canary and the config loaded again: no issue may
/// contain the canary.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let figment = crate::config::figment_from_str(&text);
    match crate::config::load(&figment) {
        Ok(settings) => {
            let mut paths = std::collections::BTreeSet::new();
            for p in &settings.providers {
                assert!(p.path.starts_with('/'), "{}: path {:?}", p.name, p.path);
                assert!(!p.secrets.is_empty(), "{} has no secret source", p.name);
                assert!(paths.insert(&p.path), "two providers on {:?}", p.path);
            }
            assert!(settings.dedupe.lease > settings.upstream.timeout);
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "an error without an issue");
            for issue in &errors.0 {
                assert!(!issue.message.is_empty(), "{}: no message", issue.key);
            }
        }
    }
    let Ok(mut top) = figment.extract::<BTreeMap<String, Value>>() else {
        return;
    };
    // Debug output escapes nothing in the canary, so this finds it in any
    // key or string the input wrote itself.
    if format!("{top:?}").contains(CANARY) || !plant_canaries(&mut top) {
        return;
    }
    let planted = Figment::from(Serialized::defaults(top));
    if let Err(errors) = crate::config::load(&planted) {
        let text = errors.to_string();
        assert!(!text.contains(CANARY), "an issue echoes a secret: {text}");
    }
}

/// What replaces the secrets in `config`'s second load.
const CANARY: &str = "hookgate-fuzz-canary";

/// Puts the canary where the config holds secrets; false when it holds none.
fn plant_canaries(top: &mut BTreeMap<String, Value>) -> bool {
    let mut planted = false;
    if let Some(Value::Dict(_, providers)) = top.get_mut("providers") {
        for provider in providers.values_mut() {
            if let Value::Dict(_, fields) = provider
                && let Some(secrets) = fields.get_mut("secrets")
            {
                plant(secrets);
                planted = true;
            }
        }
    }
    if let Some(Value::Dict(_, store)) = top.get_mut("store")
        && let Some(Value::String(_, url)) = store.get_mut("url")
    {
        // Keep the scheme, which decides how the URL is checked.
        *url = match url.split_once("://") {
            Some((scheme, rest)) => {
                let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
                format!("{scheme}://fuzz:{CANARY}@{host}")
            }
            None => CANARY.to_owned(),
        };
        planted = true;
    }
    planted
}

fn plant(value: &mut Value) {
    match value {
        Value::String(_, text) => *text = CANARY.to_owned(),
        Value::Array(_, items) => items.iter_mut().for_each(plant),
        Value::Dict(_, fields) => {
            for (name, field) in fields.iter_mut() {
                if name != "not_after" {
                    plant(field);
                }
            }
        }
        _ => {}
    }
}

/// Key extraction: the first line is a `key` setting (sources separated by
/// spaces: `json:/id`, `form:a form:b`, `json:/*/sg_event_id`, ...), the
/// second a `content-type`, the rest the body.
pub fn key_extraction(data: &[u8]) {
    let (spec, rest) = split_line(data);
    let (content_type, body) = split_line(rest);
    let Ok(source) = KeySource::parse(&words(spec)) else {
        return;
    };
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(content_type) {
        headers.insert(http::header::CONTENT_TYPE, v.clone());
        headers.insert("x-id", v);
    }
    let payload = Payload::new(body, &headers);
    match &source {
        KeySource::Batch(pointer) => {
            for mode in [FingerprintMode::Canonical, FingerprintMode::Raw] {
                if let Ok(Some(items)) = payload.batch(pointer, mode, &[]) {
                    assert!(!items.is_empty());
                    for item in items {
                        // Each element's range is its exact bytes in the body.
                        let element = &body[item.range.clone()];
                        assert!(serde_json::from_slice::<serde_json::Value>(element).is_ok());
                        assert_key_is_usable(&item.key);
                    }
                }
            }
        }
        _ => {
            let key = source.extract(&payload);
            if let Ok(Some(key)) = &key {
                assert_key_is_usable(key);
            }
            if let KeySource::Parts { parts, .. } = &source
                && let [KeyPart::Json(pointer)] = parts.as_slice()
            {
                assert_eq!(
                    key.ok().flatten(),
                    reference::json_key(body, pointer),
                    "the key differs from serde_json::Value's"
                );
            }
        }
    }
}

/// The canonical fingerprint: the first line lists volatile pointers
/// (separated by spaces), the rest is the body. Whatever the input, the
/// fingerprint is stable, and for JSON it ignores re-serialization.
pub fn fingerprint(data: &[u8]) {
    let (volatile, body) = split_line(data);
    let volatile = words(volatile);
    let mut form = HeaderMap::new();
    form.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-www-form-urlencoded"),
    );
    let plain = HeaderMap::new();
    if let Some(canonical) = reference::canonical(body, &volatile) {
        assert_eq!(
            Payload::new(body, &plain).fingerprint(FingerprintMode::Canonical, &volatile),
            const_hex::encode(Sha256::digest(canonical)),
            "the canonical bytes differ from serde_json::Value's"
        );
    }
    for headers in [&plain, &form] {
        let once = Payload::new(body, headers).fingerprint(FingerprintMode::Canonical, &volatile);
        let twice = Payload::new(body, headers).fingerprint(FingerprintMode::Canonical, &volatile);
        assert_eq!(once, twice, "the fingerprint is deterministic");
        assert_eq!(once.len(), 64);
    }
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(body) {
        let compact = serde_json::to_vec(&value).expect("a Value serializes");
        let pretty = serde_json::to_vec_pretty(&value).expect("a Value serializes");
        let fp =
            |b: &[u8]| Payload::new(b, &plain).fingerprint(FingerprintMode::Canonical, &volatile);
        assert_eq!(
            fp(&compact),
            fp(&pretty),
            "whitespace changed the fingerprint"
        );
    }
}

fn assert_key_is_usable(key: &str) {
    assert!(!key.is_empty());
    assert!(key.len() <= crate::key::MAX_KEY_BYTES);
    assert!(!key.chars().any(char::is_control));
    assert_eq!(key, key.trim());
}

/// Builds a delivery from `data` (see the module doc) and verifies it
/// against `secret`. A verification of fuzzed input must fail cleanly, with
/// an error that names a header and never a value.
fn verify(scheme: &Scheme, names: &[&'static str], data: &[u8], secret: &[u8]) -> Option<Verified> {
    let (head, body) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    };
    let mut headers = HeaderMap::new();
    let mut uri = Uri::from_static("/webhooks/fuzz");
    for (name, line) in names.iter().zip(head.split(|&b| b == b'\n')) {
        if *name == ":path" {
            if let Ok(u) = Uri::try_from(line) {
                uri = u;
            }
            continue;
        }
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    let secrets = [ActiveSecret {
        index: 0,
        value: Arc::new(SecretValue::new(secret)),
    }];
    let delivery = Delivery {
        headers: &headers,
        body,
        uri: &uri,
    };
    match scheme.verify(&delivery, &secrets) {
        Ok(verified) => {
            assert_eq!(verified.secret_index, 0);
            Some(verified)
        }
        Err(VerifyError::NoUsableSecret) => panic!("the fuzz secret is usable"),
        Err(e) => {
            let message = e.to_string();
            assert!(!message.contains(&*String::from_utf8_lossy(secret)));
            None
        }
    }
}

/// What `hookgate sign` writes for `body` verifies, with the right secret
/// only: the signer and the verifier agree on the signed bytes.
fn round_trip(scheme: &Scheme, secret: &[u8], body: &[u8]) {
    const TIMESTAMP: i64 = 1_700_000_000;
    let mut headers = HeaderMap::new();
    for (name, value) in scheme.sign(secret, body, "fuzz-delivery", TIMESTAMP) {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a scheme's header name");
        let value = HeaderValue::from_str(&value).expect("a signed header value");
        headers.insert(name, value);
    }
    let secrets = [b"not-the-secret".as_slice(), secret].map(|value| ActiveSecret {
        index: usize::from(value == secret),
        value: Arc::new(SecretValue::new(value)),
    });
    let uri = Uri::from_static("/webhooks/fuzz");
    let delivery = Delivery {
        headers: &headers,
        body,
        uri: &uri,
    };
    let verified = scheme.verify(&delivery, &secrets);
    assert!(
        matches!(
            verified,
            Ok(Verified {
                secret_index: 1,
                timestamp: None | Some(TIMESTAMP)
            })
        ),
        "{scheme} does not verify what it signs: {verified:?}"
    );
}

/// The body of the signature targets' layout: what follows the first NUL.
fn body_of(data: &[u8]) -> &[u8] {
    data.iter()
        .position(|&b| b == 0)
        .map_or(&b""[..], |at| &data[at + 1..])
}

fn split_line(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b""[..]),
    }
}

/// A line's words, separated by spaces (a fuzz input's settings line).
fn words(line: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(line)
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// The key and canonical form as computed before the gate had its own JSON
/// tree (`src/key/tree.rs`), on `serde_json::Value`: the fuzz targets and
/// the corpus replay check that the tree computes the same, since keys and
/// fingerprints already stored must keep matching.
mod reference {
    use serde_json::Value;

    pub fn json_key(body: &[u8], pointer: &str) -> Option<String> {
        let value: Value = serde_json::from_slice(body).ok()?;
        let text = match value.pointer(pointer)? {
            Value::String(s) => s.clone(),
            v @ (Value::Number(_) | Value::Bool(_)) => v.to_string(),
            _ => return None,
        };
        // Normalizing did not change with the tree: the gate's own.
        crate::key::normalize(&text).ok().flatten()
    }

    pub fn canonical(body: &[u8], volatile: &[String]) -> Option<Vec<u8>> {
        let mut value: Value = serde_json::from_slice(body).ok()?;
        for pointer in volatile {
            remove_pointer(&mut value, pointer);
        }
        let mut out = Vec::new();
        write_canonical(&value, &mut out);
        Some(out)
    }

    fn write_canonical(value: &Value, out: &mut Vec<u8>) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push(b'{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    let _ = serde_json::to_writer(&mut *out, k);
                    out.push(b':');
                    write_canonical(v, out);
                }
                out.push(b'}');
            }
            Value::Array(items) => {
                out.push(b'[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_canonical(v, out);
                }
                out.push(b']');
            }
            scalar => {
                let _ = serde_json::to_writer(out, scalar);
            }
        }
    }

    fn remove_pointer(value: &mut Value, pointer: &str) {
        let Some((parent, last)) = pointer.rsplit_once('/') else {
            return;
        };
        let last = last.replace("~1", "/").replace("~0", "~");
        match value.pointer_mut(parent) {
            Some(Value::Object(map)) => {
                map.remove(&last);
            }
            Some(Value::Array(items)) => {
                if let Ok(i) = last.parse::<usize>()
                    && i < items.len()
                {
                    items.remove(i);
                }
            }
            _ => {}
        }
    }
}
