//! Decoding what the outbox scripts answer.

use super::super::Fields;
use crate::store::Result;
use crate::store::clock::from_unix_ms;
use crate::store::outbox::{Job, JobState, JobSummary, NewJob};
use crate::store::{LeaseToken, ScopedKey, StoreError};

/// One job (or summary) a script answered, field by field.
pub(super) type Row = Fields;

pub(super) fn job(row: Row, token: &LeaseToken) -> Result<Job> {
    let mut fields = row.into_iter();
    let mut next = || fields.next().flatten();
    let id = number(next(), "job id")?;
    let attempt = number(next(), "attempts")?;
    let key = ScopedKey::new(text(next(), "provider")?, text(next(), "key")?);
    let job = NewJob {
        method: text(next(), "method")?,
        target: text(next(), "target")?,
        headers: next().unwrap_or_default().into(),
        body: next().unwrap_or_default().into(),
    };
    Ok(Job {
        id,
        key,
        job,
        received_at: from_unix_ms(number(next(), "received time")?),
        attempt,
        token: token.clone(),
    })
}

pub(super) fn summary(row: Row) -> Result<JobSummary> {
    let mut fields = row.into_iter();
    let mut next = || fields.next().flatten();
    let id = number(next(), "job id")?;
    let key = ScopedKey::new(text(next(), "provider")?, text(next(), "key")?);
    let state = text(next(), "state")?;
    Ok(JobSummary {
        id,
        key,
        state: JobState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt("redis: a job in no known state".into()))?,
        attempts: number(next(), "attempts")?,
        received_at: from_unix_ms(number(next(), "received time")?),
        due_at: from_unix_ms(number(next(), "due time")?),
        last_status: next().map(|s| number(Some(s), "status")).transpose()?,
        last_error: next().map(|e| text(Some(e), "error")).transpose()?,
    })
}

pub(super) fn text(field: Option<Vec<u8>>, name: &str) -> Result<String> {
    String::from_utf8(field.unwrap_or_default())
        .map_err(|_| StoreError::Corrupt(format!("redis: a job's {name} is not UTF-8")))
}

pub(super) fn number<T: std::str::FromStr>(field: Option<Vec<u8>>, name: &str) -> Result<T> {
    text(field, name)?
        .parse()
        .map_err(|_| StoreError::Corrupt(format!("redis: a job's {name} is not a number")))
}
