//! Signature schemes: one file per scheme, dispatched through [`Scheme`].
//!
//! Every scheme verifies over the raw body bytes, before anything is parsed,
//! against every active secret, comparing in constant time. A scheme that
//! signs a timestamp returns it; the window phase decides whether it is stale.

mod crypto;
mod descriptor;
mod github;
mod hmac;
mod sendgrid;
mod shopify;
mod slack;
mod standard;
mod stripe;
mod twilio;

use std::fmt;

use http::{HeaderMap, HeaderName, Uri};

use crate::secret::ActiveSecret;

pub use self::descriptor::{DefaultKey, Descriptor};
pub use self::hmac::{Algorithm, Encoding, HmacScheme, Template};
pub use self::sendgrid::sign_with_private_key as sendgrid_sign;
pub use self::twilio::TwilioScheme;

/// What a scheme sees of a delivery.
#[derive(Clone, Copy, Debug)]
pub struct Delivery<'a> {
    pub headers: &'a HeaderMap,
    pub body: &'a [u8],
    pub uri: &'a Uri,
}

/// A delivery whose signature matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Position of the matching secret in the provider's configured list.
    pub secret_index: usize,
    /// The signed timestamp, in Unix seconds, when the scheme signs one.
    pub timestamp: Option<i64>,
}

/// Why a signature did not verify. Messages name headers, never values.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("signature header {0} is missing")]
    MissingHeader(&'static str),
    #[error("signature header {0} is malformed")]
    Malformed(&'static str),
    /// Two headers that must name the same delivery name different ones.
    #[error("headers {0} and {1} differ")]
    Conflict(&'static str, &'static str),
    #[error("no active secret matches the signature")]
    NoMatch,
    #[error("the provider has no usable secret")]
    NoUsableSecret,
}

/// A signature scheme with its parameters.
#[derive(Clone, Debug)]
pub enum Scheme {
    Stripe,
    Github,
    Slack,
    Twilio(TwilioScheme),
    Sendgrid,
    Shopify,
    Standard,
    Hmac(HmacScheme),
}

/// Headers a real sender would attach, as (name, value) pairs.
pub type SignedHeaders = Vec<(String, String)>;

impl Scheme {
    /// The scheme's fixed facts, from its own file.
    pub fn descriptor(&self) -> &'static Descriptor {
        match self {
            Self::Stripe => &stripe::DESCRIPTOR,
            Self::Github => &github::DESCRIPTOR,
            Self::Slack => &slack::DESCRIPTOR,
            Self::Twilio(_) => &twilio::DESCRIPTOR,
            Self::Sendgrid => &sendgrid::DESCRIPTOR,
            Self::Shopify => &shopify::DESCRIPTOR,
            Self::Standard => &standard::DESCRIPTOR,
            Self::Hmac(_) => &hmac::DESCRIPTOR,
        }
    }

    pub fn name(&self) -> &'static str {
        self.descriptor().name
    }

    /// The headers that carry the signature (and the signed timestamp).
    /// They are removed when the gate forwards a body other than the signed
    /// one (a partial batch), since they no longer match it.
    pub fn signature_headers(&self) -> Vec<HeaderName> {
        match self {
            Self::Hmac(params) => params.signature_headers(),
            _ => self
                .descriptor()
                .signature_headers
                .iter()
                .map(|n| HeaderName::from_static(n))
                .collect(),
        }
    }

    /// The scheme's default idempotency key source (SPEC section 3).
    pub fn default_key(&self) -> Option<&'static str> {
        self.descriptor().key.as_ref().map(|k| k.source)
    }

    /// How long the sender keeps retrying, for `hookgate check`'s warning.
    pub fn retry_window(&self) -> Option<std::time::Duration> {
        self.descriptor().retry_window
    }

    /// Verifies the delivery against every active secret; any match passes.
    pub fn verify(
        &self,
        delivery: &Delivery<'_>,
        secrets: &[ActiveSecret],
    ) -> Result<Verified, VerifyError> {
        if secrets.is_empty() {
            return Err(VerifyError::NoUsableSecret);
        }
        match self {
            Self::Stripe => stripe::verify(delivery, secrets),
            Self::Github => github::verify(delivery, secrets),
            Self::Slack => slack::verify(delivery, secrets),
            Self::Twilio(params) => params.verify(delivery, secrets),
            Self::Sendgrid => sendgrid::verify(delivery, secrets),
            Self::Shopify => shopify::verify(delivery, secrets),
            Self::Standard => standard::verify(delivery, secrets),
            Self::Hmac(params) => params.verify(delivery, secrets),
        }
    }

    /// The headers a sender would attach to `body`, for `hookgate sign` and
    /// tests. `id` goes where the scheme carries an event id in a header.
    ///
    /// SendGrid signs with a private key that only SendGrid holds, while the
    /// configured secret is the public verification key: nothing can be
    /// signed with it, so its list is empty. Sign with a key pair of one's
    /// own through [`sendgrid_sign`] instead.
    pub fn sign(&self, secret: &[u8], body: &[u8], id: &str, timestamp: i64) -> SignedHeaders {
        match self {
            Self::Stripe => stripe::sign(secret, body, timestamp),
            Self::Github => github::sign(secret, body, id),
            Self::Slack => slack::sign(secret, body, timestamp),
            Self::Twilio(params) => params.sign(secret, body, id),
            Self::Sendgrid => SignedHeaders::new(),
            Self::Shopify => shopify::sign(secret, body, id),
            Self::Standard => standard::sign(secret, body, id, timestamp),
            Self::Hmac(params) => params.sign(secret, body, timestamp),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
