//! The `twilio` scheme: `X-Twilio-Signature: <base64>`, HMAC-SHA1 keyed by
//! the auth token over the URL Twilio called (scheme, host, port, path,
//! query), then, for form bodies, each parameter name in sorted order with
//! each of its values in sorted order, as `name` + `value`. JSON bodies are
//! covered instead by `bodySHA256=<hex>` in the signed query. Twilio signs no
//! timestamp, so the dedupe store is the only guard against replays.

use std::borrow::Cow;

use http::{HeaderMap, Uri, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::crypto::{self, Tag};
use super::descriptor::{DefaultKey, Descriptor, HOUR};
use super::{Algorithm, Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;

/// Twilio: one retry by default and no documented window; an hour is a
/// generous bound, so `check` still flags a retention shorter than that.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "twilio",
    signature_headers: &["x-twilio-signature"],
    key: Some(DefaultKey::plain("header:I-Twilio-Idempotency-Token")),
    retry_window: Some(HOUR),
    on_missing_key: OnMissingKey::Reject,
};

const HEADER: &str = "X-Twilio-Signature";
/// The query parameter that carries the SHA-256 of a JSON body.
const BODY_HASH: &str = "bodySHA256";
const FORM: &str = "application/x-www-form-urlencoded";

/// A configured `twilio` provider's parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TwilioScheme {
    /// The external URL of this provider's path as Twilio calls it, without
    /// the query. The gate sees only its own (pod-local) URL, and Twilio
    /// signs the one it called.
    pub public_url: String,
}

impl TwilioScheme {
    /// Verifies against every active secret, over the public URL plus the
    /// request's query string. As the official SDKs do, the URL is tried both
    /// with and without the scheme's default port, because Twilio's own
    /// signing is not consistent about it.
    pub fn verify(
        &self,
        delivery: &Delivery<'_>,
        secrets: &[ActiveSecret],
    ) -> Result<Verified, VerifyError> {
        let signature =
            crypto::decode_base64(crypto::header_text(delivery.headers, HEADER, HEADER)?)
                .ok_or(VerifyError::Malformed(HEADER))?;
        let query = delivery.uri.query();
        let params = signed_params(delivery, query)?;
        let mut outcome = Err(VerifyError::NoMatch);
        for url in url_variants(&self.public_url) {
            let mut parts: Vec<&[u8]> = vec![url.as_bytes()];
            if let Some(query) = query {
                parts.extend([b"?".as_slice(), query.as_bytes()]);
            }
            for (name, value) in &params {
                parts.extend([name.as_bytes(), value.as_bytes()]);
            }
            outcome = crypto::first_match(
                Algorithm::Sha1,
                secrets,
                crypto::raw_key,
                &parts,
                std::slice::from_ref(&signature),
            );
            if outcome.is_ok() {
                break;
            }
        }
        Ok(Verified {
            secret_index: outcome?,
            timestamp: None,
        })
    }

    /// The headers Twilio would send for `body`, taken as a form body posted
    /// to the public URL without a query: the signature, the idempotency
    /// token (`id`) and the form content type.
    pub fn sign(&self, secret: &[u8], body: &[u8], id: &str) -> SignedHeaders {
        let params = form_params(body).unwrap_or_default();
        let mut parts: Vec<&[u8]> = vec![self.public_url.as_bytes()];
        for (name, value) in &params {
            parts.extend([name.as_bytes(), value.as_bytes()]);
        }
        let tag = Tag::compute(Algorithm::Sha1, secret, &parts);
        vec![
            (HEADER.to_owned(), tag.to_base64()),
            ("I-Twilio-Idempotency-Token".to_owned(), id.to_owned()),
            ("Content-Type".to_owned(), FORM.to_owned()),
        ]
    }
}

/// The parameters signed after the URL, sorted.
///
/// - `bodySHA256` in the query: the body must hash to it (compared in
///   constant time) and no parameters are signed;
/// - a form body: its parameters;
/// - an empty body: none.
///
/// Any other body would not be covered by the signature at all, so it can
/// never match; neither can a form whose fields are not UTF-8 once decoded.
fn signed_params(
    delivery: &Delivery<'_>,
    query: Option<&str>,
) -> Result<Vec<(String, String)>, VerifyError> {
    let body_hash = query.and_then(|q| {
        form_urlencoded::parse(q.as_bytes())
            .find(|(name, _)| name == BODY_HASH)
            .map(|(_, value)| value)
    });
    if let Some(expected) = body_hash {
        let expected = crypto::decode_hex(expected.as_bytes()).unwrap_or_default();
        let actual = Sha256::digest(delivery.body);
        return if bool::from(actual.as_slice().ct_eq(&expected)) {
            Ok(Vec::new())
        } else {
            Err(VerifyError::NoMatch)
        };
    }
    if is_form(delivery.headers) {
        form_params(delivery.body).ok_or(VerifyError::NoMatch)
    } else if delivery.body.is_empty() {
        Ok(Vec::new())
    } else {
        Err(VerifyError::NoMatch)
    }
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|ct| ct.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(FORM))
}

/// A form body's pairs, sorted by name then value, identical pairs once (as
/// twilio-python's `sorted(set(values))`). None when a name or value is not
/// UTF-8 once decoded: a lossy decoding would sign `%FF` and `%FE` as the
/// same text, so the forwarded bytes would not be the ones signed.
fn form_params(body: &[u8]) -> Option<Vec<(String, String)>> {
    let mut pairs = body
        .split(|&b| b == b'&')
        .filter(|field| !field.is_empty())
        .map(|field| {
            let (name, value) = match field.iter().position(|&b| b == b'=') {
                Some(at) => (&field[..at], &field[at + 1..]),
                None => (field, &b""[..]),
            };
            Some((form_decode(name)?, form_decode(value)?))
        })
        .collect::<Option<Vec<_>>>()?;
    pairs.sort_unstable();
    pairs.dedup();
    Some(pairs)
}

/// Decodes one form component (`+` is a space, `%XX` a byte) as the WHATWG
/// form decoding does, keeping a `%` not followed by two hex digits, but
/// refusing a result that is not UTF-8.
fn form_decode(text: &[u8]) -> Option<String> {
    let mut out = Vec::with_capacity(text.len());
    let mut rest = text;
    while let Some((&b, tail)) = rest.split_first() {
        rest = tail;
        match b {
            b'+' => out.push(b' '),
            // Into one byte: `const_hex` takes a leading `0x` as a prefix
            // (`decode` would turn `%0x` into nothing), which leaves no
            // characters for the byte, an error here.
            b'%' => match tail
                .get(..2)
                .and_then(|h| const_hex::decode_to_array::<_, 1>(h).ok())
            {
                Some(byte) => {
                    out.extend(byte);
                    rest = &tail[2..];
                }
                None => out.push(b'%'),
            },
            _ => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

/// The public URL as configured, then the same URL with the scheme's default
/// port removed (when it is there) or added (when no port is given). Any
/// other port is left alone.
fn url_variants(url: &str) -> Vec<Cow<'_, str>> {
    let mut variants = vec![Cow::Borrowed(url)];
    variants.extend(other_port_form(url).map(Cow::Owned));
    variants
}

fn other_port_form(url: &str) -> Option<String> {
    let uri: Uri = url.parse().ok()?;
    let default_port = match uri.scheme_str()? {
        "https" => "443",
        "http" => "80",
        _ => return None,
    };
    let authority = uri.authority()?.as_str();
    let (scheme, rest) = url.split_once("://")?;
    let after = rest.strip_prefix(authority)?;
    match uri.port() {
        None if authority.ends_with(':') => None,
        None => Some(format!("{scheme}://{authority}:{default_port}{after}")),
        Some(port) if port.as_str() == default_port => {
            let host = authority.strip_suffix(default_port)?.strip_suffix(':')?;
            Some(format!("{scheme}://{host}{after}"))
        }
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run, signed_pairs};

    /// twilio-python's `tests/unit/test_request_validator.py`: the token,
    /// the URL Twilio called (`PUBLIC_URL` + `?foo=1&bar=2`), and the
    /// signatures of the five call parameters and of the repeated ones.
    const TOKEN: &[u8] = b"12345";
    const PUBLIC_URL: &str = "https://mycompany.com/myapp.php";
    const GATE_URI: &str = "/webhooks/twilio?foo=1&bar=2";
    const OFFICIAL: &str = "RSOYDt4T1cUTdK1PDd93/VVr8B8=";
    const REPEATED: &str = "IK+Dwps556ElfBT0I3Rgjkr1wJU=";
    /// The same file's signatures of that URL with `:443`, with `http` and
    /// `:80`, and with `http` and `:1234`.
    const WITH_443: &str = "kvajT1Ptam85bY51eRf/AJRuM3w=";
    const HTTP_WITH_80: &str = "0ZXoZLH/DfblKGATFgpif+LLRf4=";
    const HTTP_WITH_1234: &str = "Zmvh+3yNM1Phv2jhDCwEM3q5ebU=";
    /// The same file's JSON vector: the body's hash is appended to the
    /// query as `bodySHA256`, and that URL alone is signed.
    const JSON_BODY: &[u8] = br#"{"property": "value", "boolean": true}"#;
    const JSON_HASH: &str = "0a1ff7634d9ab3b95db5c9a2dfe9416e41502b283a80c7cf19632632f96e6620";
    const JSON_SIGNATURE: &str = "a9nBmqA0ju/hNViExpshrM61xv4=";

    fn form(pairs: &[(&str, &str)]) -> Vec<u8> {
        form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
            .into_bytes()
    }

    fn official_body() -> Vec<u8> {
        form(&[
            ("CallSid", "CA1234567890ABCDE"),
            ("Digits", "1234"),
            ("From", "+14158675309"),
            ("To", "+18005551212"),
            ("Caller", "+14158675309"),
        ])
    }

    fn twilio(public_url: &str) -> TwilioScheme {
        TwilioScheme {
            public_url: public_url.to_owned(),
        }
    }

    /// Verifies a delivery that reached the gate at `uri` (whose query is
    /// the one Twilio called) with these headers.
    fn check_with(
        public_url: &str,
        uri: &str,
        pairs: Pairs<'_>,
        body: &[u8],
        keys: &[&[u8]],
    ) -> Outcome {
        run(
            |d, s| twilio(public_url).verify(d, s),
            uri,
            pairs,
            body,
            keys,
        )
    }

    /// The same for a form delivery with this signature.
    fn check(public_url: &str, uri: &str, signature: &str, body: &[u8], keys: &[&[u8]]) -> Outcome {
        let pairs: [(&str, &[u8]); 2] = [
            (HEADER, signature.as_bytes()),
            ("Content-Type", FORM.as_bytes()),
        ];
        check_with(public_url, uri, &pairs, body, keys)
    }

    /// Asserts that the official form delivery matches for none of these
    /// (public URL, gate URI) pairs, naming the one that does.
    fn assert_official_never_matches(cases: &[(&str, &str)]) {
        let body = official_body();
        for (public_url, uri) in cases {
            let got = check(public_url, uri, OFFICIAL, &body, &[TOKEN]);
            assert_eq!(got, Err(VerifyError::NoMatch), "{public_url:?} {uri}");
        }
    }

    #[test]
    fn official_vectors_verify() {
        let repeated = form(&[
            ("Sid", "CA123"),
            ("SidAccount", "AC123"),
            ("Digits", "5678"),
            ("Digits", "1234"),
        ]);
        for (signature, body) in [(OFFICIAL, official_body()), (REPEATED, repeated)] {
            let got = check(PUBLIC_URL, GATE_URI, signature, &body, &[TOKEN]);
            assert_eq!(
                got,
                Ok(Verified {
                    secret_index: 0,
                    timestamp: None
                }),
                "{signature}"
            );
        }
    }

    #[test]
    fn official_port_vectors() {
        let body = official_body();
        let cases = [
            // Twilio signed with `:443`, the public URL has no port.
            (PUBLIC_URL, WITH_443),
            ("http://mycompany.com/myapp.php", HTTP_WITH_80),
            // Twilio signed without a port, the public URL names `:443`.
            ("https://mycompany.com:443/myapp.php", OFFICIAL),
            // Another port is signed as it is.
            ("http://mycompany.com:1234/myapp.php", HTTP_WITH_1234),
        ];
        for (public_url, signature) in cases {
            let got = check(public_url, GATE_URI, signature, &body, &[TOKEN]);
            assert_eq!(got.map(|v| v.secret_index), Ok(0), "{public_url}");
        }
        // twilio-python also drops a non-default port (its
        // `test_validation_removes_port_on_https`); the gate does not: its
        // public URL is configured, not guessed from a proxied request.
        let public_url = "https://mycompany.com:1234/myapp.php";
        let got = check(public_url, GATE_URI, OFFICIAL, &body, &[TOKEN]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn official_json_vector_verifies() {
        assert_eq!(const_hex::encode(Sha256::digest(JSON_BODY)), JSON_HASH);
        let uri = format!("{GATE_URI}&{BODY_HASH}={JSON_HASH}");
        let pairs: [(&str, &[u8]); 2] = [
            (HEADER, JSON_SIGNATURE.as_bytes()),
            ("Content-Type", b"application/json"),
        ];
        for public_url in [PUBLIC_URL, "https://mycompany.com:443/myapp.php"] {
            let got = check_with(public_url, &uri, &pairs, JSON_BODY, &[TOKEN]);
            assert_eq!(got.map(|v| v.secret_index), Ok(0), "{public_url}");
        }
        let tampered = br#"{"property": "value", "boolean": false}"#;
        let got = check_with(PUBLIC_URL, &uri, &pairs, tampered, &[TOKEN]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn body_sha256_round_trips_and_wrong_hashes_fail() {
        let body = br#"{"event":"x"}"#;
        let hash = const_hex::encode(Sha256::digest(body));
        // The gate's URI and the signature of the public URL with that query.
        let delivery = |hash: &str| {
            let query = format!("{BODY_HASH}={hash}");
            let url = format!("{PUBLIC_URL}?{query}");
            let tag = Tag::compute(Algorithm::Sha1, TOKEN, &[url.as_bytes()]);
            (format!("/webhooks/twilio?{query}"), tag.to_base64())
        };
        for good in [hash.clone(), hash.to_uppercase()] {
            let (uri, signature) = delivery(&good);
            let pairs: [(&str, &[u8]); 1] = [(HEADER, signature.as_bytes())];
            let got = check_with(PUBLIC_URL, &uri, &pairs, body, &[b"other", TOKEN]);
            assert_eq!(got.map(|v| v.secret_index), Ok(1), "{good}");
        }
        let (uri, signature) = delivery(&hash);
        let pairs: [(&str, &[u8]); 1] = [(HEADER, signature.as_bytes())];
        let got = check_with(PUBLIC_URL, &uri, &pairs, br#"{"event":"y"}"#, &[TOKEN]);
        assert_eq!(got, Err(VerifyError::NoMatch));
        // A hash of other bytes, not hex, cut short or empty matches nothing.
        let other = const_hex::encode(Sha256::digest(b"other"));
        for bad in [other.as_str(), "zz", &hash[..62], ""] {
            let (uri, signature) = delivery(bad);
            let pairs: [(&str, &[u8]); 1] = [(HEADER, signature.as_bytes())];
            let got = check_with(PUBLIC_URL, &uri, &pairs, body, &[TOKEN]);
            assert_eq!(got, Err(VerifyError::NoMatch), "{bad:?}");
        }
    }

    #[test]
    fn the_query_is_part_of_the_signed_url() {
        assert_official_never_matches(&[
            (PUBLIC_URL, "/webhooks/twilio"),
            (PUBLIC_URL, "/webhooks/twilio?"),
            (PUBLIC_URL, "/webhooks/twilio?bar=2&foo=1"),
            (PUBLIC_URL, "/webhooks/twilio?foo=1&bar=3"),
        ]);
    }

    #[test]
    fn url_variants_add_or_remove_only_the_default_port() {
        let cases: [(&str, Option<&str>); 9] = [
            ("https://a.example/p", Some("https://a.example:443/p")),
            ("https://a.example:443/p", Some("https://a.example/p")),
            ("http://a.example/p?", Some("http://a.example:80/p?")),
            ("http://a.example:80", Some("http://a.example")),
            ("https://u@a.example:443/p", Some("https://u@a.example/p")),
            ("https://a.example:8443/p", None),
            ("https://a.example:80/p", None),
            ("https://a.example:/p", None),
            ("not a url", None),
        ];
        for (url, other) in cases {
            assert_eq!(other_port_form(url).as_deref(), other, "{url}");
        }
    }

    #[test]
    fn parameters_are_signed_decoded_and_sorted() {
        // Reordered fields and another spelling of the same text keep the
        // signature: Twilio signs the decoded, sorted parameters.
        let body = b"Caller=%2B14158675309&To=%2b18005551212&From=%2B14158675309&\
            Digits=1234&CallSid=CA1234567890ABCDE";
        assert!(check(PUBLIC_URL, GATE_URI, OFFICIAL, body, &[TOKEN]).is_ok());
        let repeated = b"Digits=1234&SidAccount=AC123&Digits=5678&Sid=CA123";
        assert!(check(PUBLIC_URL, GATE_URI, REPEATED, repeated, &[TOKEN]).is_ok());
    }

    #[test]
    fn form_decoding_matches_the_standard_one_and_refuses_non_utf8() {
        let bodies: [&[u8]; 7] = [
            b"a=1&b=%2B2&c=x+y&d&=e&&f==g",
            b"n=%C3%A9t%C3%A9&%7E=%7e",
            b"bad=%zz&half=%4&end=%",
            b"x=%0x&y=%0X1&z=%x0",
            b"",
            b"Body=Hello%2C+world%21",
            "raw=ünïcode".as_bytes(),
        ];
        for body in bodies {
            let mut standard: Vec<(String, String)> = form_urlencoded::parse(body)
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            standard.sort();
            standard.dedup();
            assert_eq!(form_params(body), Some(standard), "{body:?}");
        }
        for bad in [&b"a=%FF"[..], b"a=\xff", b"%C3=1"] {
            assert_eq!(form_params(bad), None, "{bad:?}");
        }
        // So a delivery with such a field never verifies, even signed.
        let headers = twilio(PUBLIC_URL).sign(TOKEN, b"Digits=%FF", "id");
        let got = check(PUBLIC_URL, "/t", &headers[0].1, b"Digits=%FF", &[TOKEN]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn tampered_body_or_wrong_token_fails() {
        let mut body = official_body();
        body.extend_from_slice(b"&Extra=1");
        let got = check(PUBLIC_URL, GATE_URI, OFFICIAL, &body, &[TOKEN]);
        assert_eq!(got, Err(VerifyError::NoMatch));
        let got = check(
            PUBLIC_URL,
            GATE_URI,
            OFFICIAL,
            &official_body(),
            &[b"54321"],
        );
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn second_secret_matching_reports_its_index() {
        let got = check(
            "https://mycompany.com:443/myapp.php",
            GATE_URI,
            OFFICIAL,
            &official_body(),
            &[b"old-token", TOKEN],
        );
        assert_eq!(got.map(|v| v.secret_index), Ok(1));
    }

    #[test]
    fn only_form_bodies_are_signed_by_their_parameters() {
        let headers = twilio(PUBLIC_URL).sign(TOKEN, b"A=1", "id");
        let signature = headers[0].1.as_bytes();
        for ct in [
            &b"application/x-www-form-urlencoded; charset=UTF-8"[..],
            b"Application/X-WWW-Form-Urlencoded",
        ] {
            let pairs: [(&str, &[u8]); 2] = [(HEADER, signature), ("Content-Type", ct)];
            let got = check_with(PUBLIC_URL, "/t", &pairs, b"A=1", &[TOKEN]);
            assert!(got.is_ok(), "{ct:?}");
        }
        // Without a form content type and without bodySHA256, the signature
        // covers the URL only: an empty body passes, any other body would be
        // unauthenticated and never does.
        let headers = twilio(PUBLIC_URL).sign(TOKEN, b"", "id");
        let signature = headers[0].1.as_bytes();
        let got = check_with(PUBLIC_URL, "/t", &[(HEADER, signature)], b"", &[TOKEN]);
        assert_eq!(got.map(|v| v.secret_index), Ok(0));
        let json: [(&str, &[u8]); 2] = [(HEADER, signature), ("Content-Type", b"application/json")];
        for pairs in [&json[..], &json[..1]] {
            let got = check_with(PUBLIC_URL, "/t", pairs, br#"{"a":1}"#, &[TOKEN]);
            assert_eq!(got, Err(VerifyError::NoMatch));
        }
    }

    #[test]
    fn missing_and_malformed_headers() {
        let form_only: [(&str, &[u8]); 1] = [("Content-Type", FORM.as_bytes())];
        assert_eq!(
            check_with(PUBLIC_URL, "/t", &form_only, b"A=1", &[TOKEN]),
            Err(VerifyError::MissingHeader("X-Twilio-Signature"))
        );
        for bad in [&b""[..], b"not base64!", b"\xff", b"===="] {
            let pairs: [(&str, &[u8]); 2] = [(HEADER, bad), form_only[0]];
            assert_eq!(
                check_with(PUBLIC_URL, "/t", &pairs, b"A=1", &[TOKEN]),
                Err(VerifyError::Malformed(HEADER)),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_malformed_public_url_never_panics_or_matches() {
        assert_official_never_matches(&[
            ("", GATE_URI),
            ("not a url", GATE_URI),
            ("https://", GATE_URI),
            ("https://mycompany.com:/myapp.php", GATE_URI),
        ]);
    }

    #[test]
    fn sign_reproduces_the_official_vector_and_round_trips() {
        // Signing at the official URL, query included, gives its signature.
        let url = format!("{PUBLIC_URL}?foo=1&bar=2");
        let headers = twilio(&url).sign(TOKEN, &official_body(), "idem-1");
        assert_eq!(
            headers,
            vec![
                (HEADER.to_owned(), OFFICIAL.to_owned()),
                ("I-Twilio-Idempotency-Token".to_owned(), "idem-1".to_owned()),
                ("Content-Type".to_owned(), FORM.to_owned()),
            ]
        );

        let public_url = "https://hooks.example.com/webhooks/twilio";
        let body = b"MessageSid=SM1&MessageStatus=delivered&Body=Hi+there%21";
        let headers = twilio(public_url).sign(b"token", body, "idem-2");
        let pairs = signed_pairs(&headers);
        let got = check_with(public_url, "/webhooks/twilio", &pairs, body, &[b"token"]);
        assert_eq!(got.map(|v| v.secret_index), Ok(0));
        let sent = b"MessageSid=SM1&MessageStatus=sent&Body=Hi+there%21";
        let got = check_with(public_url, "/webhooks/twilio", &pairs, sent, &[b"token"]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }
}
