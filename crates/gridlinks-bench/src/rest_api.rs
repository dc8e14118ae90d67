//! The few ThingsBoard REST calls the generator makes: log in, bulk-import devices
//! (`--provision`, into a device profile it saves with `--device-profile`), look a device
//! up by name, and read or delete the stored timestamps of one telemetry key (the loss
//! check). Blocking (`ureq`), so callers run it on plain threads, never on the async
//! runtime's workers.

use std::io::Read as _;
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

/// Most points one timeseries query returns (the server's `limit` ceiling); longer
/// ranges are read page by page.
pub const MAX_POINTS_PER_QUERY: usize = 100_000;

/// Devices per bulk-import request: keeps each request body well under a megabyte.
const IMPORT_CHUNK: usize = 1000;

/// Time allowed for one REST call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the REST API is and who logs in (`--api`, `--api-user`, `--api-password`).
#[derive(Clone)]
pub struct ApiTarget {
    /// Base URL, e.g. `http://127.0.0.1:8080`, without a trailing slash.
    pub base: String,
    /// Administrator user name.
    pub user: String,
    /// Administrator password.
    pub password: String,
}

impl std::fmt::Debug for ApiTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTarget")
            .field("base", &self.base)
            .field("user", &self.user)
            .field("password", &"<REDACTED>")
            .finish()
    }
}

/// A logged-in REST client; cheap to clone and share between threads (one connection
/// pool).
#[derive(Clone)]
pub struct RestClient {
    /// Pooled HTTP agent.
    agent: ureq::Agent,
    /// Base URL without a trailing slash.
    base: String,
    /// `Bearer <jwt>` for `X-Authorization`.
    bearer: String,
}

impl RestClient {
    /// Logs in as the administrator.
    pub fn login(target: &ApiTarget) -> anyhow::Result<Self> {
        let agent = ureq::AgentBuilder::new().timeout(CALL_TIMEOUT).max_idle_connections_per_host(64).build();
        let base = target.base.trim_end_matches('/').to_string();
        let reply: Value = agent
            .post(&format!("{base}/api/auth/login"))
            .send_json(json!({"username": target.user, "password": target.password}))
            .map_err(describe)
            .with_context(|| format!("logging in to {base} as {}", target.user))?
            .into_json()?;
        let token = reply["token"].as_str().context("login reply has no token")?;
        Ok(RestClient { agent, base, bearer: format!("Bearer {token}") })
    }

    /// Creates (or, when they exist, updates) devices `names[i]` with access token
    /// `tokens[i]` through `POST /api/device/bulk_import`.
    pub fn bulk_import(&self, names: &[String], tokens: &[String]) -> anyhow::Result<()> {
        self.bulk_import_typed(names, tokens, None)
    }

    /// [`RestClient::bulk_import`], the devices of the device profile named `profile`
    /// (the import's `TYPE` column; an existing device moves to it) when one is given.
    pub fn bulk_import_typed(&self, names: &[String], tokens: &[String], profile: Option<&str>) -> anyhow::Result<()> {
        assert_eq!(names.len(), tokens.len(), "one token per device name");
        let mut columns = vec![json!({"type": "NAME"}), json!({"type": "ACCESS_TOKEN"})];
        if profile.is_some() {
            columns.push(json!({"type": "TYPE"}));
        }
        // A profile name with the delimiter or a quote in it is quoted, as CSV does.
        let profile = profile.map(|p| match p.contains([',', '"']) {
            true => format!(",\"{}\"", p.replace('"', "\"\"")),
            false => format!(",{p}"),
        });
        let profile = profile.as_deref().unwrap_or("");
        for (names, tokens) in names.chunks(IMPORT_CHUNK).zip(tokens.chunks(IMPORT_CHUNK)) {
            let file: String = names.iter().zip(tokens).map(|(n, t)| format!("{n},{t}{profile}\n")).collect();
            let reply: Value = self
                .agent
                .post(&format!("{}/api/device/bulk_import", self.base))
                .set("X-Authorization", &self.bearer)
                .send_json(json!({
                    "file": file,
                    "mapping": {
                        "columns": columns,
                        "delimiter": ",",
                        "update": true,
                        "header": false,
                    },
                }))
                .map_err(describe)
                .context("bulk-importing devices")?
                .into_json()?;
            if reply["errors"].as_u64().unwrap_or(0) > 0 {
                bail!("bulk import reported errors: {}", reply["errorsList"]);
            }
        }
        Ok(())
    }

    /// Saves the device profile `profile` (ThingsBoard's `DeviceProfile` JSON, with its
    /// alarm rules in `profileData.alarms`) through `POST /api/deviceProfile`: a new one,
    /// or, when the tenant has a profile of that name, that one, replaced. Its name.
    pub fn save_device_profile(&self, profile: &Value) -> anyhow::Result<String> {
        let name = profile["name"].as_str().context("the device profile has no \"name\"")?.to_owned();
        let mut body = profile.clone();
        let existing = self.get_json("/api/deviceProfile/names")?;
        let same = existing.as_array().into_iter().flatten().find(|p| p["name"].as_str() == Some(name.as_str()));
        if let Some(p) = same {
            body["id"] = p["id"].clone();
        }
        self.post_json("/api/deviceProfile", &body).with_context(|| format!("saving device profile {name}"))?;
        Ok(name)
    }

    /// `POST {path}` with a JSON body; the JSON answer.
    pub fn post_json(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        Ok(self
            .agent
            .post(&format!("{}{path}", self.base))
            .set("X-Authorization", &self.bearer)
            .send_json(body)
            .map_err(describe)
            .with_context(|| format!("POST {path}"))?
            .into_json()?)
    }

    /// `GET {path}`; the JSON answer.
    pub fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        Ok(self
            .agent
            .get(&format!("{}{path}", self.base))
            .set("X-Authorization", &self.bearer)
            .call()
            .map_err(describe)
            .with_context(|| format!("GET {path}"))?
            .into_json()?)
    }

    /// `DELETE {path}`.
    pub fn delete(&self, path: &str) -> anyhow::Result<()> {
        self.agent
            .delete(&format!("{}{path}", self.base))
            .set("X-Authorization", &self.bearer)
            .call()
            .map_err(describe)
            .with_context(|| format!("DELETE {path}"))?;
        Ok(())
    }

    /// `GET {path}`; the answer as text (e.g. `/metrics`).
    pub fn get_text(&self, path: &str) -> anyhow::Result<String> {
        Ok(self
            .agent
            .get(&format!("{}{path}", self.base))
            .set("X-Authorization", &self.bearer)
            .call()
            .map_err(describe)
            .with_context(|| format!("GET {path}"))?
            .into_string()?)
    }

    /// As the system administrator: a new tenant titled `title`, with the tenant profile
    /// whose id object (`{"entityType":"TENANT_PROFILE","id":…}`) is `profile` (`None`:
    /// the default profile), and its administrator `email`, activated with `password`; the
    /// administrator's API target.
    pub fn tenant_admin(
        &self,
        title: &str,
        profile: Option<&Value>,
        email: &str,
        password: &str,
    ) -> anyhow::Result<ApiTarget> {
        let mut body = json!({"title": title});
        if let Some(profile) = profile {
            body["tenantProfileId"] = profile.clone();
        }
        let tenant = self.post_json("/api/tenant", &body)?;
        let body = json!({"email": email, "authority": "TENANT_ADMIN", "tenantId": tenant["id"]});
        let user = self.post_json("/api/user?sendActivationMail=false", &body)?;
        let id = user["id"]["id"].as_str().context("the new user has no id")?;
        let link = self.get_json(&format!("/api/user/{id}/activationLinkInfo"))?;
        let token = link["value"].as_str().and_then(|l| l.split("activateToken=").nth(1));
        let token = token.context("the activation link has no token")?;
        self.post_json("/api/noauth/activate", &json!({"activateToken": token, "password": password}))?;
        Ok(ApiTarget { base: self.base.clone(), user: email.to_owned(), password: password.to_owned() })
    }

    /// The access token of this login.
    pub fn token(&self) -> &str {
        self.bearer.trim_start_matches("Bearer ")
    }

    /// The id of the device named `name`, `None` when there is none.
    pub fn device_id(&self, name: &str) -> anyhow::Result<Option<String>> {
        let reply = self
            .agent
            .get(&format!("{}/api/tenant/devices", self.base))
            .set("X-Authorization", &self.bearer)
            .query("deviceName", name)
            .call();
        let device: Value = match reply {
            Ok(r) => r.into_json()?,
            Err(ureq::Error::Status(404, _)) => return Ok(None),
            Err(e) => return Err(describe(e)).with_context(|| format!("looking up device {name}")),
        };
        Ok(device["id"]["id"].as_str().map(String::from))
    }

    /// Every stored timestamp of `key` of device `id` in `[start, end)`, ascending;
    /// read in pages of [`MAX_POINTS_PER_QUERY`].
    pub fn timestamps(&self, id: &str, key: &str, start: u64, end: u64) -> anyhow::Result<Vec<u64>> {
        Ok(self.points(id, key, start, end)?.into_iter().map(|(ts, _)| ts).collect())
    }

    /// Every stored integer value of `key` of device `id` at timestamps in `[start, end)`,
    /// in timestamp order (a point that is not a non-negative integer is an error).
    pub fn integer_values(&self, id: &str, key: &str, start: u64, end: u64) -> anyhow::Result<Vec<u64>> {
        self.points(id, key, start, end)?
            .into_iter()
            .map(|(ts, v)| v.as_u64().with_context(|| format!("{key} at {ts} of device {id} is {v}, not an integer")))
            .collect()
    }

    /// Every stored (ts, value) of `key` of device `id` in `[start, end)`, ascending, values
    /// with their types; read in pages of [`MAX_POINTS_PER_QUERY`].
    fn points(&self, id: &str, key: &str, start: u64, end: u64) -> anyhow::Result<Vec<(u64, Value)>> {
        let mut out: Vec<(u64, Value)> = Vec::new();
        let mut from = start;
        while from < end {
            let reply: Value = self
                .timeseries(id, key)
                .query("startTs", &from.to_string())
                .query("endTs", &end.to_string())
                .query("limit", &MAX_POINTS_PER_QUERY.to_string())
                .query("orderBy", "ASC")
                .query("useStrictDataTypes", "true")
                .call()
                .map_err(describe)
                .with_context(|| format!("reading {key} of device {id}"))?
                .into_json()?;
            let points = reply[key].as_array().map(Vec::as_slice).unwrap_or(&[]);
            let before = out.len();
            for p in points {
                out.push((p["ts"].as_u64().context("timeseries point without ts")?, p["value"].clone()));
            }
            if points.len() < MAX_POINTS_PER_QUERY {
                break;
            }
            // A full page: go on after its last point.
            from = out[out.len() - 1].0 + 1;
            if out.len() == before {
                break;
            }
        }
        Ok(out)
    }

    /// A timeseries read of `key` of device `id` (latest value unless a range is added).
    fn timeseries(&self, id: &str, key: &str) -> ureq::Request {
        self.agent
            .get(&format!("{}/api/plugins/telemetry/DEVICE/{id}/values/timeseries", self.base))
            .set("X-Authorization", &self.bearer)
            .query("keys", key)
    }

    /// The `ts` of the latest stored point of `key` of device `id`, if any.
    pub fn latest_ts(&self, id: &str, key: &str) -> anyhow::Result<Option<u64>> {
        let reply: Value = self
            .timeseries(id, key)
            .call()
            .map_err(describe)
            .with_context(|| format!("reading latest {key} of device {id}"))?
            .into_json()?;
        Ok(reply[key][0]["ts"].as_u64())
    }

    /// Deletes the points of `key` of device `id` between `start` and `end`.
    pub fn delete_timeseries(&self, id: &str, key: &str, start: u64, end: u64) -> anyhow::Result<()> {
        self.agent
            .delete(&format!("{}/api/plugins/telemetry/DEVICE/{id}/timeseries/delete", self.base))
            .set("X-Authorization", &self.bearer)
            .query("keys", key)
            .query("startTs", &start.to_string())
            .query("endTs", &end.to_string())
            .call()
            .map_err(describe)
            .with_context(|| format!("deleting {key} of device {id}"))?;
        Ok(())
    }
}

/// A ureq error with the server's reply body, which says what was wrong.
fn describe(e: ureq::Error) -> anyhow::Error {
    match e {
        ureq::Error::Status(code, reply) => {
            let mut body = String::new();
            let _ = reply.into_reader().take(2048).read_to_string(&mut body);
            anyhow::anyhow!("HTTP {code}: {body}")
        }
        other => anyhow::Error::new(other),
    }
}

/// A device profile file (`--device-profile`): ThingsBoard's `DeviceProfile` JSON with at
/// least a `name`.
pub fn read_device_profile(path: &std::path::Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading device profile {}", path.display()))?;
    let profile: Value =
        serde_json::from_str(&text).with_context(|| format!("device profile {} is not JSON", path.display()))?;
    if profile["name"].as_str().is_none_or(|n| n.trim().is_empty()) {
        bail!("device profile {} has no \"name\"", path.display());
    }
    Ok(profile)
}

/// `n` random access tokens (`bench-` and 24 hex digits from /dev/urandom).
pub fn random_tokens(n: usize) -> anyhow::Result<Vec<String>> {
    let mut bytes = vec![0u8; n * 12];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).context("reading /dev/urandom")?;
    Ok(bytes
        .chunks(12)
        .map(|c| {
            let hex: String = c.iter().map(|b| format!("{b:02x}")).collect();
            format!("bench-{hex}")
        })
        .collect())
}
