//! Device claiming, as ThingsBoard does it. A device opens a claim with a secret for a
//! while (MQTT `v1/devices/me/claim`, HTTP and CoAP `POST /api/v1/{token}/claim`, body
//! `{"secretKey","durationMs"}`); a customer user who knows the device's name and the secret
//! then claims it (`POST /api/customer/device/{deviceName}/claim` `{"secretKey"}`), which
//! assigns the device to the user's customer. `DELETE` on the same path gives it back.
//!
//! Open claims are kept in memory, as ThingsBoard keeps them in its cache: a restart
//! closes them, and the device claims again. A wrong secret closes the claim too, so a
//! secret cannot be guessed by trying.

use std::collections::HashMap;

use gridlinks_thingsboard::payload::{parse_claim, ClaimRequest};
use gridlinks_types::{DeviceId, Ts};
use parking_lot::Mutex;

use crate::core::Core;

/// How long a claim stays open when the device does not say, ms (ThingsBoard: one day).
pub const DEFAULT_DURATION_MS: u64 = 24 * 3600 * 1000;

struct Open {
    secret: String,
    /// Ms since epoch.
    expires: i64,
}

/// The open claims, one per device at most.
#[derive(Default)]
pub struct Claims {
    open: Mutex<HashMap<DeviceId, Open>>,
}

/// What a claim attempt found.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// The claim was open and the secret right: it is closed now.
    Yes,
    /// The claim was open but expired, or the secret wrong: it is closed now.
    Refused,
    /// No claim was open.
    NotOpen,
}

impl Claims {
    /// Opens (or replaces) `device`'s claim at `now` (ms).
    pub fn open(&self, device: DeviceId, req: ClaimRequest, now: i64) {
        let duration = req.duration_ms.unwrap_or(DEFAULT_DURATION_MS);
        let expires = now.saturating_add(i64::try_from(duration).unwrap_or(i64::MAX));
        let mut open = self.open.lock();
        // Claims of deleted or silent devices go once expired.
        if open.len() >= 1024 && open.len().is_power_of_two() {
            open.retain(|_, o| o.expires > now);
        }
        open.insert(device, Open { secret: req.secret_key, expires });
    }

    /// Takes `device`'s claim with `secret` at `now`: whatever the outcome, it is closed.
    pub fn take(&self, device: DeviceId, secret: &str, now: i64) -> Taken {
        let Some(o) = self.open.lock().remove(&device) else { return Taken::NotOpen };
        let same = o.secret.len() == secret.len()
            && o.secret.bytes().zip(secret.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
        if same && now < o.expires {
            Taken::Yes
        } else {
            Taken::Refused
        }
    }
}

/// A device's claiming request from any transport: opens the claim.
pub fn open_from_device(
    core: &Core,
    device: DeviceId,
    body: &[u8],
) -> Result<(), gridlinks_thingsboard::payload::PayloadError> {
    core.claims.open(device, parse_claim(body)?, Ts::now().0);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(secret: &str, duration_ms: Option<u64>) -> ClaimRequest {
        ClaimRequest { secret_key: secret.into(), duration_ms }
    }

    #[test]
    fn a_claim_is_taken_once_with_its_secret_before_it_expires() {
        let claims = Claims::default();
        let d = DeviceId(uuid::Uuid::new_v4());
        assert_eq!(claims.take(d, "", 0), Taken::NotOpen);
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::Yes);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::NotOpen, "taken once");
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s4", 1_050), Taken::Refused);
        assert_eq!(claims.take(d, "s3", 1_050), Taken::NotOpen, "a wrong secret closes it");
        claims.open(d, req("s3", Some(100)), 1_000);
        assert_eq!(claims.take(d, "s3", 1_100), Taken::Refused, "expired at its time");
        claims.open(d, req("", None), 1_000);
        assert_eq!(claims.take(d, "", 1_000 + DEFAULT_DURATION_MS as i64 - 1), Taken::Yes, "no secret: empty");
    }
}
