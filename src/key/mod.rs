//! Idempotency keys (where they come from, how they are normalized) and the
//! payload fingerprint that tells a re-serialized retry from a changed one.

mod tree;

use std::cell::OnceCell;

use http::{HeaderMap, HeaderName};
use sha2::{Digest, Sha256};

use crate::settings::FingerprintMode;
use tree::Node;

/// The longest key accepted, in bytes: keys are stored and forwarded in a
/// header, and an unbounded one would let a sender grow the store at will.
pub const MAX_KEY_BYTES: usize = 512;

/// One source of (part of) a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyPart {
    /// The first of these headers that is present (aliases: Standard
    /// Webhooks' `webhook-id` is `svix-id` on Svix deliveries).
    Header(Vec<HeaderName>),
    /// An RFC 6901 pointer into a JSON body.
    Json(String),
    /// A field of an `application/x-www-form-urlencoded` body.
    Form(String),
}

/// Where a provider's idempotency key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeySource {
    /// One part, or several joined with `:` in order; every part must exist.
    /// `scope` names a header whose value, when present, prefixes the key
    /// (GitHub's `X-GitHub-Hook-ID`: one delivery GUID can reach many hooks).
    Parts {
        parts: Vec<KeyPart>,
        scope: Option<HeaderName>,
    },
    /// SHA-256 of the raw body: an explicit last resort.
    BodySha256,
    /// `json:/*/<pointer>`: the body is a JSON array and each element is
    /// keyed on its own (SendGrid's `sg_event_id`).
    Batch(String),
}

/// One element of a batch body: where it sits in the body, its key and its
/// own fingerprint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchItem {
    pub range: std::ops::Range<usize>,
    pub key: String,
    pub fingerprint: String,
}

impl KeyPart {
    fn parse(spec: &str) -> Result<Self, String> {
        if let Some(name) = spec.strip_prefix("header:") {
            let name = HeaderName::try_from(name.trim())
                .map_err(|_| format!("`{spec}` names an invalid header"))?;
            Ok(Self::Header(vec![name]))
        } else if let Some(pointer) = spec.strip_prefix("json:") {
            if pointer.starts_with("/*/") {
                return Err(format!("`{spec}`: a batch key cannot be part of a list"));
            }
            if !pointer.is_empty() && !pointer.starts_with('/') {
                return Err(format!("`{spec}`: a JSON pointer starts with `/`"));
            }
            Ok(Self::Json(pointer.to_owned()))
        } else if let Some(field) = spec.strip_prefix("form:") {
            if field.is_empty() {
                return Err(format!("`{spec}` needs a field name"));
            }
            Ok(Self::Form(field.to_owned()))
        } else {
            Err(format!(
                "`{spec}`: a key source starts with `header:`, `json:` or `form:`"
            ))
        }
    }
}

impl KeySource {
    /// Parses the parts of a `key` setting.
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        match specs {
            [] => Err("a key needs at least one source".into()),
            [one] if one == "body_sha256" => Ok(Self::BodySha256),
            [one] if one.starts_with("json:/*/") => {
                Ok(Self::Batch(one["json:/*".len()..].to_owned()))
            }
            _ => Ok(Self::Parts {
                parts: specs
                    .iter()
                    .map(|s| KeyPart::parse(s))
                    .collect::<Result<_, _>>()?,
                scope: None,
            }),
        }
    }

    /// Adds an alias to a single-header key: read when the first is absent.
    pub fn or_header(mut self, alias: HeaderName) -> Self {
        if let Self::Parts { parts, .. } = &mut self
            && let [KeyPart::Header(names)] = parts.as_mut_slice()
        {
            names.push(alias);
        }
        self
    }

    /// Adds a scoping header (see [`KeySource::Parts`]).
    pub fn scoped_by(mut self, header: HeaderName) -> Self {
        if let Self::Parts { scope, .. } = &mut self {
            *scope = Some(header);
        }
        self
    }

    /// Extracts and normalizes the key. `Ok(None)`: some part is absent.
    /// A batch source has no single key: see [`Payload::batch`].
    pub fn extract(&self, payload: &Payload<'_>) -> Result<Option<String>, KeyError> {
        let key = match self {
            Self::Batch(_) => return Ok(None),
            Self::BodySha256 => const_hex::encode(Sha256::digest(payload.raw)),
            Self::Parts { parts, scope } => {
                let mut values = Vec::with_capacity(parts.len() + 1);
                if let Some(scope) = scope.as_ref().and_then(|h| header_text(payload.headers, h)) {
                    values.push(scope);
                }
                for part in parts {
                    match part.value(payload)? {
                        Some(v) => values.push(v),
                        None => return Ok(None),
                    }
                }
                values.join(":")
            }
        };
        normalize(&key)
    }
}

impl KeyPart {
    fn value(&self, payload: &Payload<'_>) -> Result<Option<String>, KeyError> {
        Ok(match self {
            Self::Header(names) => names.iter().find_map(|n| header_text(payload.headers, n)),
            // A source that does not apply to the body's content type finds
            // no key (`on_missing_key` decides); a body that claims a type
            // and does not parse as it is a bad payload.
            Self::Json(pointer) => match payload.content {
                Content::Json => json_key(payload.json()?, pointer),
                // A form whose `payload` field is JSON (GitHub's form
                // deliveries, Slack's interactivity).
                Content::Form => payload
                    .form()?
                    .iter()
                    .find(|(k, _)| k == "payload")
                    .and_then(|(_, v)| json_key(&Node::parse(v.as_bytes())?, pointer)),
                Content::Other => payload.json().ok().and_then(|j| json_key(j, pointer)),
            },
            Self::Form(field) => match payload.content {
                Content::Json => None,
                Content::Form => form_value(payload.form()?, field),
                Content::Other => payload.form().ok().and_then(|f| form_value(f, field)),
            },
        })
    }
}

fn json_key(root: &Node<'_>, pointer: &str) -> Option<String> {
    root.pointer(pointer)
        .and_then(Node::key_text)
        .map(|text| text.into_owned())
}

fn form_value(pairs: &[(String, String)], field: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(k, _)| k == field)
        .map(|(_, v)| v.clone())
}

fn header_text(headers: &HeaderMap, name: &HeaderName) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// Trims and lower-cases; an empty key is no key. Keys travel in a header
/// and into every store, so control characters and excess length are refused.
pub(crate) fn normalize(raw: &str) -> Result<Option<String>, KeyError> {
    let key = raw.trim().to_lowercase();
    if key.is_empty() {
        return Ok(None);
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(KeyError::Invalid("the idempotency key is too long"));
    }
    if key.chars().any(char::is_control) {
        return Err(KeyError::Invalid(
            "the idempotency key contains control characters",
        ));
    }
    Ok(Some(key))
}

/// Why no key could be extracted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("body is not valid JSON")]
    NotJson,
    #[error("body is not a valid form")]
    NotForm,
    #[error("{0}")]
    Invalid(&'static str),
}

/// What a body says it is, by its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content {
    /// `application/json` or a `+json` type: it must parse as JSON.
    Json,
    /// `application/x-www-form-urlencoded`: it must parse as a form.
    Form,
    /// Anything else, or no type: read as whatever it parses as.
    Other,
}

impl Content {
    fn of(headers: &HeaderMap) -> Self {
        let Some(value) = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
        else {
            return Self::Other;
        };
        let essence = value.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            Self::Form
        } else if essence.eq_ignore_ascii_case("application/json")
            || essence
                .get(essence.len().saturating_sub(5)..)
                .is_some_and(|tail| tail.eq_ignore_ascii_case("+json"))
        {
            Self::Json
        } else {
            Self::Other
        }
    }
}

/// The raw body with lazily parsed views, so that key extraction and the
/// fingerprint parse it at most once.
pub struct Payload<'a> {
    pub raw: &'a [u8],
    pub headers: &'a HeaderMap,
    content: Content,
    json: OnceCell<Option<Node<'a>>>,
    form: OnceCell<Option<Vec<(String, String)>>>,
}

impl<'a> Payload<'a> {
    pub fn new(raw: &'a [u8], headers: &'a HeaderMap) -> Self {
        Self {
            raw,
            headers,
            content: Content::of(headers),
            json: OnceCell::new(),
            form: OnceCell::new(),
        }
    }

    fn json(&self) -> Result<&Node<'a>, KeyError> {
        self.json
            .get_or_init(|| Node::parse(self.raw))
            .as_ref()
            .ok_or(KeyError::NotJson)
    }

    fn form(&self) -> Result<&[(String, String)], KeyError> {
        self.form
            .get_or_init(|| {
                // Form bodies are ASCII by definition; anything else is not one.
                std::str::from_utf8(self.raw).ok()?;
                Some(
                    form_urlencoded::parse(self.raw)
                        .map(|(k, v)| (k.into_owned(), v.into_owned()))
                        .collect(),
                )
            })
            .as_deref()
            .ok_or(KeyError::NotForm)
    }

    /// Splits a JSON array body into its elements, each with its key (at
    /// `pointer`) and fingerprint. `Ok(None)`: an element has no key, or
    /// the array is empty.
    pub fn batch(
        &self,
        pointer: &str,
        mode: FingerprintMode,
        volatile: &[String],
    ) -> Result<Option<Vec<BatchItem>>, KeyError> {
        let parsed = match self.content {
            Content::Form => return Ok(None),
            Content::Json => serde_json::from_slice(self.raw).map_err(|_| KeyError::NotJson)?,
            Content::Other => match serde_json::from_slice(self.raw) {
                Ok(elements) => elements,
                Err(_) => return Ok(None),
            },
        };
        let elements: Vec<&serde_json::value::RawValue> = parsed;
        if elements.is_empty() {
            return Ok(None);
        }
        let base = self.raw.as_ptr() as usize;
        let mut items = Vec::with_capacity(elements.len());
        for element in elements {
            let text = element.get();
            // RawValue borrows from the body, so its offset locates the
            // element's exact bytes for re-assembling a partial batch.
            let start = text.as_ptr() as usize - base;
            let range = start..start + text.len();
            let element = Payload::new(text.as_bytes(), self.headers);
            let key = match element.json()?.pointer(pointer).and_then(Node::key_text) {
                Some(text) => normalize(&text)?,
                None => None,
            };
            let Some(key) = key else { return Ok(None) };
            let fingerprint = element.fingerprint(mode, volatile);
            items.push(BatchItem {
                range,
                key,
                fingerprint,
            });
        }
        Ok(Some(items))
    }

    /// SHA-256 (hex) of the canonical payload; empty when disabled.
    ///
    /// Canonical JSON sorts keys at every level, drops insignificant
    /// whitespace and normalizes escapes, after removing `volatile` pointers;
    /// a form is its sorted pairs; anything else its raw bytes. The last
    /// use of the payload: volatile fields are removed from its parsed tree.
    pub fn fingerprint(mut self, mode: FingerprintMode, volatile: &[String]) -> String {
        let digest = match mode {
            FingerprintMode::None => return String::new(),
            FingerprintMode::Raw => Sha256::digest(self.raw),
            FingerprintMode::Canonical => {
                let _ = self.json();
                if let Some(mut json) = self.json.take().flatten() {
                    for pointer in volatile {
                        json.remove(pointer);
                    }
                    let mut out = Vec::with_capacity(self.raw.len());
                    json.write_canonical(&mut out);
                    Sha256::digest(&out)
                } else if let Some(pairs) = (self.content == Content::Form)
                    .then(|| self.form().ok())
                    .flatten()
                {
                    let mut pairs = pairs.to_vec();
                    pairs.sort();
                    let canonical = form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(pairs)
                        .finish();
                    Sha256::digest(canonical.as_bytes())
                } else {
                    Sha256::digest(self.raw)
                }
            }
        };
        const_hex::encode(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(specs: &[&str], headers: &HeaderMap, body: &[u8]) -> Result<Option<String>, KeyError> {
        let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
        KeySource::parse(&specs)
            .unwrap()
            .extract(&Payload::new(body, headers))
    }

    #[test]
    fn sources_extract_and_normalize() {
        let mut h = HeaderMap::new();
        h.insert("x-id", " ABC-1 ".parse().unwrap());
        assert_eq!(key(&["header:X-Id"], &h, b""), Ok(Some("abc-1".into())));
        assert_eq!(
            key(&["json:/data/id"], &h, br#"{"data":{"id":"Evt_9"}}"#),
            Ok(Some("evt_9".into()))
        );
        assert_eq!(key(&["json:/n"], &h, br#"{"n":42}"#), Ok(Some("42".into())));
        assert_eq!(
            key(
                &["form:MessageSid", "form:MessageStatus"],
                &h,
                b"MessageSid=SM1&MessageStatus=sent"
            ),
            Ok(Some("sm1:sent".into()))
        );
        assert_eq!(key(&["form:A", "form:B"], &h, b"A=1"), Ok(None));
        assert_eq!(key(&["json:/id"], &h, br#"{"id":"  "}"#), Ok(None));
    }

    #[test]
    fn a_source_applies_only_to_its_content_type() {
        let typed = |ct: &str| {
            let mut h = HeaderMap::new();
            h.insert("content-type", ct.parse().unwrap());
            h
        };
        let json = typed("application/json; charset=utf-8");
        let form = typed("application/x-www-form-urlencoded");
        let none = HeaderMap::new();
        // A body that claims JSON and is not: bad payload.
        assert_eq!(
            key(&["json:/id"], &json, b"{not json"),
            Err(KeyError::NotJson)
        );
        assert_eq!(
            key(&["json:/id"], &typed("application/cloudevents+json"), b"["),
            Err(KeyError::NotJson)
        );
        // A body that claims nothing: read as what it parses as.
        assert_eq!(key(&["json:/id"], &none, b"{not json"), Ok(None));
        assert_eq!(
            key(&["json:/id"], &none, br#"{"id":"E"}"#),
            Ok(Some("e".into()))
        );
        // A json key on a form: the `payload` field's JSON, else no key.
        let slash = b"command=%2Fdeploy&text=now";
        assert_eq!(key(&["json:/event_id"], &form, slash), Ok(None));
        let interactive =
            b"payload=%7B%22type%22%3A%22block_actions%22%2C%22event_id%22%3A%22Ev9%22%7D";
        assert_eq!(
            key(&["json:/event_id"], &form, interactive),
            Ok(Some("ev9".into()))
        );
        assert_eq!(key(&["json:/x"], &form, b"payload=%7Bbroken"), Ok(None));
        // A form key on a JSON body: no key.
        assert_eq!(
            key(&["form:MessageSid"], &json, br#"{"MessageSid":"SM1"}"#),
            Ok(None)
        );
        assert_eq!(
            key(&["form:MessageSid"], &form, b"MessageSid=SM1"),
            Ok(Some("sm1".into()))
        );
        assert_eq!(key(&["form:A"], &form, b"A=\xff"), Err(KeyError::NotForm));
    }

    #[test]
    fn header_aliases_are_read_in_order() {
        let src = KeySource::parse(&["header:webhook-id".into()])
            .unwrap()
            .or_header(HeaderName::from_static("svix-id"));
        let mut h = HeaderMap::new();
        h.insert("svix-id", "msg_svix".parse().unwrap());
        assert_eq!(
            src.extract(&Payload::new(b"", &h)),
            Ok(Some("msg_svix".into()))
        );
        h.insert("webhook-id", "msg_std".parse().unwrap());
        assert_eq!(
            src.extract(&Payload::new(b"", &h)),
            Ok(Some("msg_std".into()))
        );
    }

    #[test]
    fn scope_prefixes_the_key_when_present() {
        let src = KeySource::parse(&["header:X-GitHub-Delivery".into()])
            .unwrap()
            .scoped_by(HeaderName::from_static("x-github-hook-id"));
        let mut h = HeaderMap::new();
        h.insert("x-github-delivery", "GUID".parse().unwrap());
        assert_eq!(src.extract(&Payload::new(b"", &h)), Ok(Some("guid".into())));
        h.insert("x-github-hook-id", "77".parse().unwrap());
        assert_eq!(
            src.extract(&Payload::new(b"", &h)),
            Ok(Some("77:guid".into()))
        );
    }

    #[test]
    fn bad_keys_are_refused() {
        let h = HeaderMap::new();
        let long = format!(r#"{{"id":"{}"}}"#, "a".repeat(MAX_KEY_BYTES + 1));
        assert!(matches!(
            key(&["json:/id"], &h, long.as_bytes()),
            Err(KeyError::Invalid(_))
        ));
        assert!(matches!(
            key(&["json:/id"], &h, br#"{"id":"a\nb"}"#),
            Err(KeyError::Invalid(_))
        ));
        assert!(KeySource::parse(&["query:id".into()]).is_err());
    }

    #[test]
    fn batches_split_into_keyed_elements_with_their_exact_bytes() {
        let h = HeaderMap::new();
        let body = br#"[{"sg_event_id":"A","n":1}, {"n":2,"sg_event_id":"b"}]"#;
        let src = KeySource::parse(&["json:/*/sg_event_id".into()]).unwrap();
        assert_eq!(src, KeySource::Batch("/sg_event_id".into()));
        let items = Payload::new(body, &h)
            .batch("/sg_event_id", FingerprintMode::Canonical, &[])
            .unwrap()
            .unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(items[0].key, "a");
        assert_eq!(
            &body[items[1].range.clone()],
            br#"{"n":2,"sg_event_id":"b"}"#
        );
        assert_ne!(items[0].fingerprint, items[1].fingerprint);
        let missing = br#"[{"sg_event_id":"a"},{"x":1}]"#;
        let p = Payload::new(missing, &h);
        assert_eq!(
            p.batch("/sg_event_id", FingerprintMode::Canonical, &[]),
            Ok(None)
        );
        let mut json = HeaderMap::new();
        json.insert("content-type", "application/json".parse().unwrap());
        let p = Payload::new(b"{\"not\":\"an array\"}", &json);
        assert_eq!(
            p.batch("/id", FingerprintMode::Raw, &[]),
            Err(KeyError::NotJson)
        );
        let mut form = HeaderMap::new();
        form.insert(
            "content-type",
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        let p = Payload::new(b"a=1", &form);
        assert_eq!(p.batch("/id", FingerprintMode::Raw, &[]), Ok(None));
    }

    #[test]
    fn canonical_fingerprint_ignores_serialization_but_not_content() {
        let h = HeaderMap::new();
        let fp = |b: &[u8], vol: &[String]| {
            Payload::new(b, &h).fingerprint(FingerprintMode::Canonical, vol)
        };
        let a = fp(br#"{"id":"e1","n":[1,2],"s":"\u00e9"}"#, &[]);
        let b = fp(
            b"{ \"s\" : \"\xc3\xa9\",\n  \"n\": [1, 2], \"id\": \"e1\" }",
            &[],
        );
        assert_eq!(a, b);
        assert_ne!(a, fp(br#"{"id":"e1","n":[2,1],"s":"\u00e9"}"#, &[]));
        let vol = vec!["/attempt".to_string()];
        assert_eq!(
            fp(br#"{"id":"e1","attempt":1}"#, &vol),
            fp(br#"{"attempt":2,"id":"e1"}"#, &vol)
        );
        assert_eq!(
            Payload::new(b"x", &h).fingerprint(FingerprintMode::None, &[]),
            ""
        );
    }

    /// The canonical bytes are pinned in `tree`; this pins their digest,
    /// which is what the stores hold, as released versions computed it.
    #[test]
    fn canonical_fingerprint_is_stable() {
        let body = br#"{"z":[1,{"y":null,"x":true}],"\u00e9\n\"k":"v\u0001\/","a":1.50,"n":-0}"#;
        let h = HeaderMap::new();
        assert_eq!(
            Payload::new(body, &h).fingerprint(FingerprintMode::Canonical, &[]),
            "7538a6ded8d257685b8cc2e3d83aed019ce666ed8744169a1e2f4ab3fc9a0ce8"
        );
        let fp = Payload::new(body, &h).fingerprint(FingerprintMode::Canonical, &[]);
        let vol = Payload::new(body, &h).fingerprint(FingerprintMode::Canonical, &["/q".into()]);
        assert_eq!(fp, vol, "an absent volatile pointer changes nothing");
    }

    #[test]
    fn form_fingerprint_is_order_independent() {
        let mut h = HeaderMap::new();
        h.insert(
            "content-type",
            "application/x-www-form-urlencoded".parse().unwrap(),
        );
        let a = Payload::new(b"a=1&b=2", &h).fingerprint(FingerprintMode::Canonical, &[]);
        let b = Payload::new(b"b=2&a=1", &h).fingerprint(FingerprintMode::Canonical, &[]);
        let raw = Payload::new(b"b=2&a=1", &h).fingerprint(FingerprintMode::Raw, &[]);
        assert_eq!(a, b);
        assert_ne!(a, raw);
    }
}
