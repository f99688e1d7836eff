//! The generic `hmac` scheme: any sender that signs with HMAC, configured by
//! header, prefix, encoding, algorithm, timestamp header and payload template.

use http::HeaderName;
use serde::Deserialize;

use super::crypto::{self, Tag};
use super::descriptor::Descriptor;
use super::{Delivery, SignedHeaders, Verified, VerifyError};
use crate::secret::ActiveSecret;
use crate::settings::OnMissingKey;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Hex,
    Base64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Sha1,
    Sha256,
    Sha512,
}

/// One piece of a signed-payload template such as `{timestamp}.{body}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Part {
    Literal(Vec<u8>),
    Timestamp,
    Body,
}

/// A parsed `signed_payload` template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template(pub Vec<Part>);

impl Template {
    /// Parses `{timestamp}` and `{body}` placeholders; `{body}` must appear once.
    /// Any other `{...}` is refused rather than signed literally, since it is
    /// almost certainly a misspelt placeholder.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut literal = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            literal.extend_from_slice(&rest.as_bytes()[..open]);
            let after = &rest[open + 1..];
            let close = after
                .find('}')
                .ok_or("signed_payload has a `{` that is never closed")?;
            let part = match &after[..close] {
                "timestamp" => Part::Timestamp,
                "body" => Part::Body,
                other => {
                    return Err(format!(
                        "signed_payload has an unknown placeholder `{{{other}}}`: \
                         only {{timestamp}} and {{body}} are known"
                    ));
                }
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
            rest = &after[close + 1..];
        }
        literal.extend_from_slice(rest.as_bytes());
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        match parts.iter().filter(|p| **p == Part::Body).count() {
            1 => Ok(Self(parts)),
            0 => Err("signed_payload must contain {body}".into()),
            _ => Err("signed_payload may contain {body} only once".into()),
        }
    }

    /// Whether the template signs the timestamp header's value.
    pub fn uses_timestamp(&self) -> bool {
        self.0.contains(&Part::Timestamp)
    }

    /// The signed bytes as slices; None when the template needs a timestamp
    /// and there is none.
    fn parts<'a>(&'a self, timestamp: Option<&'a str>, body: &'a [u8]) -> Option<Vec<&'a [u8]>> {
        self.0
            .iter()
            .map(|part| match part {
                Part::Literal(bytes) => Some(bytes.as_slice()),
                Part::Timestamp => timestamp.map(str::as_bytes),
                Part::Body => Some(body),
            })
            .collect()
    }
}

impl Encoding {
    fn decode(self, text: &str) -> Option<Vec<u8>> {
        match self {
            Self::Hex => crypto::decode_hex(text),
            Self::Base64 => crypto::decode_base64(text),
        }
    }
}

/// Header names come from the config and `MissingHeader` holds a `&'static
/// str`, so errors name the header's role instead.
/// Any HMAC signer: its headers are parameters (see
/// [`HmacScheme::signature_headers`]), and it has no default key.
pub const DESCRIPTOR: Descriptor = Descriptor {
    name: "hmac",
    signature_headers: &[],
    key: None,
    retry_window: None,
    on_missing_key: OnMissingKey::Reject,
};

const SIGNATURE: &str = "signature header";
const TIMESTAMP: &str = "timestamp header";

/// A configured `hmac` provider's signing parameters.
#[derive(Clone, Debug)]
pub struct HmacScheme {
    pub header: HeaderName,
    pub prefix: String,
    pub encoding: Encoding,
    pub algorithm: Algorithm,
    pub timestamp_header: Option<HeaderName>,
    pub template: Template,
}

impl HmacScheme {
    /// The configured signature header, and the timestamp header if any.
    pub fn signature_headers(&self) -> Vec<HeaderName> {
        let mut names = vec![self.header.clone()];
        names.extend(self.timestamp_header.clone());
        names
    }

    /// Verifies against every active secret. The timestamp, when a header is
    /// configured, is returned unchecked: the window phase judges it.
    pub fn verify(
        &self,
        delivery: &Delivery<'_>,
        secrets: &[ActiveSecret],
    ) -> Result<Verified, VerifyError> {
        let headers = delivery.headers;
        let signature = crypto::header_text(headers, &self.header, SIGNATURE)?
            .strip_prefix(self.prefix.as_str())
            .and_then(|text| self.encoding.decode(text))
            .ok_or(VerifyError::Malformed(SIGNATURE))?;
        let timestamp = self
            .timestamp_header
            .as_ref()
            .map(|name| crypto::signed_timestamp(headers, name, TIMESTAMP))
            .transpose()?;
        let parts = self
            .template
            .parts(timestamp.map(|(text, _)| text), delivery.body)
            .ok_or(VerifyError::MissingHeader(TIMESTAMP))?;
        let secret_index = crypto::first_match(
            self.algorithm,
            secrets,
            crypto::raw_key,
            &parts,
            &[signature],
        )?;
        Ok(Verified {
            secret_index,
            timestamp: timestamp.map(|(_, seconds)| seconds),
        })
    }

    /// The signature header (with its prefix) and, when configured, the
    /// timestamp header a sender would attach.
    pub fn sign(&self, secret: &[u8], body: &[u8], timestamp: i64) -> SignedHeaders {
        let ts = timestamp.to_string();
        let parts = self.template.parts(Some(&ts), body).unwrap_or_default();
        let tag = Tag::compute(self.algorithm, secret, &parts);
        let encoded = match self.encoding {
            Encoding::Hex => tag.to_hex(),
            Encoding::Base64 => tag.to_base64(),
        };
        let mut headers = vec![(self.header.to_string(), format!("{}{encoded}", self.prefix))];
        if let Some(name) = &self.timestamp_header {
            headers.push((name.to_string(), ts));
        }
        headers
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::provider::crypto::tests::{Outcome, Pairs, run, signed_pairs};

    const SLACK_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&\
        team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&\
        user_name=roadrunner&command=%2Fwebhook-collect&text=&\
        response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&\
        trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";

    fn scheme(
        header: &str,
        prefix: &str,
        encoding: Encoding,
        algorithm: Algorithm,
        timestamp_header: Option<&str>,
        template: &str,
    ) -> HmacScheme {
        HmacScheme {
            header: HeaderName::from_bytes(header.as_bytes()).unwrap(),
            prefix: prefix.into(),
            encoding,
            algorithm,
            timestamp_header: timestamp_header
                .map(|h| HeaderName::from_bytes(h.as_bytes()).unwrap()),
            template: Template::parse(template).unwrap(),
        }
    }

    fn acme(encoding: Encoding, algorithm: Algorithm) -> HmacScheme {
        scheme(
            "X-Signature",
            "",
            encoding,
            algorithm,
            Some("X-Timestamp"),
            "{timestamp}.{body}",
        )
    }

    fn check(scheme: &HmacScheme, pairs: Pairs<'_>, body: &[u8], keys: &[&[u8]]) -> Outcome {
        run(
            |d, s| scheme.verify(d, s),
            "/webhooks/acme",
            pairs,
            body,
            keys,
        )
    }

    #[test]
    fn template_parses_placeholders_and_literals() {
        assert_eq!(
            Template::parse("v0:{timestamp}:{body}").unwrap(),
            Template(vec![
                Part::Literal(b"v0:".to_vec()),
                Part::Timestamp,
                Part::Literal(b":".to_vec()),
                Part::Body,
            ])
        );
        assert_eq!(
            Template::parse("{body}").unwrap(),
            Template(vec![Part::Body])
        );
        let t = Template::parse("{timestamp}{timestamp}{body}}x").unwrap();
        assert_eq!(t.0.last(), Some(&Part::Literal(b"}x".to_vec())));
        assert!(t.uses_timestamp());
        assert!(!Template::parse("a{body}").unwrap().uses_timestamp());
    }

    #[test]
    fn template_errors_explain_themselves() {
        let unknown = Template::parse("{timestamp}.{bdy}").unwrap_err();
        assert!(unknown.contains("`{bdy}`"), "{unknown}");
        assert!(Template::parse("{}{body}").unwrap_err().contains("`{}`"));
        assert!(Template::parse("{Body}").unwrap_err().contains("`{Body}`"));
        assert!(
            Template::parse("{body")
                .unwrap_err()
                .contains("never closed")
        );
        assert!(
            Template::parse("")
                .unwrap_err()
                .contains("must contain {body}")
        );
        assert!(
            Template::parse("{timestamp}.")
                .unwrap_err()
                .contains("must contain")
        );
        assert!(
            Template::parse("{body}{body}")
                .unwrap_err()
                .contains("only once")
        );
    }

    #[test]
    fn a_timestamp_template_without_a_timestamp_header_refuses() {
        // Config validation forbids this; should it slip through, verification
        // refuses rather than signs less than the template says.
        let mut headerless = acme(Encoding::Hex, Algorithm::Sha256);
        headerless.timestamp_header = None;
        let sig = headerless.sign(b"k", b"{}", 5)[0].1.clone();
        let got = check(
            &headerless,
            &[("X-Signature", sig.as_bytes())],
            b"{}",
            &[b"k"],
        );
        assert_eq!(got, Err(VerifyError::MissingHeader("timestamp header")));
    }

    #[test]
    fn slack_vector_with_prefix_hex_and_timestamp() {
        let slack = scheme(
            "X-Slack-Signature",
            "v0=",
            Encoding::Hex,
            Algorithm::Sha256,
            Some("X-Slack-Request-Timestamp"),
            "v0:{timestamp}:{body}",
        );
        let signature = b"v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";
        let pairs: [(&str, &[u8]); 2] = [
            ("X-Slack-Signature", signature),
            ("X-Slack-Request-Timestamp", b"1531420618"),
        ];
        let key: &[u8] = b"8f742231b10e8888abcd99yyyzzz85a5";
        let got = check(&slack, &pairs, SLACK_BODY.as_bytes(), &[key]);
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 0,
                timestamp: Some(1531420618)
            })
        );
        let moved: [(&str, &[u8]); 2] = [pairs[0], ("X-Slack-Request-Timestamp", b"1531420619")];
        let got = check(&slack, &moved, SLACK_BODY.as_bytes(), &[key]);
        assert_eq!(got, Err(VerifyError::NoMatch));
        let unprefixed: [(&str, &[u8]); 2] = [("X-Slack-Signature", &signature[3..]), pairs[1]];
        let got = check(&slack, &unprefixed, SLACK_BODY.as_bytes(), &[key]);
        assert_eq!(got, Err(VerifyError::Malformed("signature header")));
    }

    #[test]
    fn shopify_vector_base64_without_prefix_or_timestamp() {
        let shopify = scheme(
            "X-Shopify-Hmac-Sha256",
            "",
            Encoding::Base64,
            Algorithm::Sha256,
            None,
            "{body}",
        );
        let pairs: [(&str, &[u8]); 1] = [(
            "X-Shopify-Hmac-Sha256",
            b"B23tXN681gZ0qIWNRrgtzBE9XSDo5yaUu6wfmhu3a7g=",
        )];
        let got = check(
            &shopify,
            &pairs,
            br#"{"foo": "bar"}"#,
            &[b"old", b"test_secret_key"],
        );
        assert_eq!(
            got,
            Ok(Verified {
                secret_index: 1,
                timestamp: None
            })
        );
        let got = check(&shopify, &pairs, br#"{"foo":"bar"}"#, &[b"test_secret_key"]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn sha1_hex_and_sha512_base64_known_values() {
        let sha1 = scheme(
            "X-Sig",
            "sha1=",
            Encoding::Hex,
            Algorithm::Sha1,
            None,
            "{body}",
        );
        let pairs: [(&str, &[u8]); 1] =
            [("X-Sig", b"sha1=30255aeba90e649434f379d0a118778a69ff8c23")];
        assert!(check(&sha1, &pairs, br#"{"id":"a1"}"#, &[b"acme-secret"]).is_ok());

        let sha512 = acme(Encoding::Base64, Algorithm::Sha512);
        let signature = "3Etcp+jdYt2iDyKY8Rw9wuCsP8P4sgdpNC6POv4koqQjMlBDJwfRxaMOppTMHGt5xMkmTnO1Zo80WD7U1oQyxA==";
        let pairs: [(&str, &[u8]); 2] = [
            ("X-Signature", signature.as_bytes()),
            ("X-Timestamp", b"1700000000"),
        ];
        let got = check(&sha512, &pairs, br#"{"id":"a1"}"#, &[b"acme-secret"]);
        assert_eq!(got.map(|v| v.timestamp), Ok(Some(1_700_000_000)));
        // The same bytes under another algorithm must not verify.
        let sha256 = acme(Encoding::Base64, Algorithm::Sha256);
        let got = check(&sha256, &pairs, br#"{"id":"a1"}"#, &[b"acme-secret"]);
        assert_eq!(got, Err(VerifyError::NoMatch));
    }

    #[test]
    fn missing_and_malformed_headers() {
        let s = acme(Encoding::Hex, Algorithm::Sha256);
        let good = s.sign(b"k", b"{}", 5);
        let sig = good[0].1.as_bytes();
        let cases: [(Pairs<'_>, VerifyError); 6] = [
            (
                &[("X-Timestamp", b"5")],
                VerifyError::MissingHeader("signature header"),
            ),
            (
                &[("X-Signature", sig)],
                VerifyError::MissingHeader("timestamp header"),
            ),
            (
                &[("X-Signature", b"zz"), ("X-Timestamp", b"5")],
                VerifyError::Malformed("signature header"),
            ),
            (
                &[("X-Signature", b"\xff"), ("X-Timestamp", b"5")],
                VerifyError::Malformed("signature header"),
            ),
            (
                &[("X-Signature", sig), ("X-Timestamp", b"5.0")],
                VerifyError::Malformed("timestamp header"),
            ),
            (
                &[("X-Signature", sig), ("X-Timestamp", b"")],
                VerifyError::Malformed("timestamp header"),
            ),
        ];
        for (pairs, expected) in cases {
            assert_eq!(
                check(&s, pairs, b"{}", &[b"k"]),
                Err(expected.clone()),
                "{expected}"
            );
        }
        let b64 = acme(Encoding::Base64, Algorithm::Sha256);
        let pairs: [(&str, &[u8]); 2] = [("X-Signature", b"not base64!"), ("X-Timestamp", b"5")];
        assert_eq!(
            check(&b64, &pairs, b"{}", &[b"k"]),
            Err(VerifyError::Malformed("signature header"))
        );
    }

    #[test]
    fn sign_round_trips_for_every_shape() {
        let encodings = [Encoding::Hex, Encoding::Base64];
        let algorithms = [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Sha512];
        let shapes = [
            ("", None, "{body}"),
            ("sha=", None, "prefix:{body}"),
            ("", Some("X-Ts"), "{timestamp}.{body}"),
            ("v1=", Some("X-Ts"), "{body}|{timestamp}"),
        ];
        for encoding in encodings {
            for algorithm in algorithms {
                for (prefix, ts_header, template) in shapes {
                    let s = scheme("X-Sig", prefix, encoding, algorithm, ts_header, template);
                    let headers = s.sign(b"secret", b"{\"n\":1}", 1_700_000_000);
                    assert_eq!(headers.len(), 1 + usize::from(ts_header.is_some()));
                    assert!(headers[0].1.starts_with(prefix));
                    let pairs = signed_pairs(&headers);
                    let got = check(&s, &pairs, b"{\"n\":1}", &[b"other", b"secret"]);
                    let expected = Verified {
                        secret_index: 1,
                        timestamp: ts_header.map(|_| 1_700_000_000),
                    };
                    assert_eq!(got, Ok(expected), "{encoding:?} {algorithm:?} {template}");
                    let got = check(&s, &pairs, b"{\"n\":2}", &[b"secret"]);
                    assert_eq!(
                        got,
                        Err(VerifyError::NoMatch),
                        "{encoding:?} {algorithm:?} {template}"
                    );
                }
            }
        }
    }
}
