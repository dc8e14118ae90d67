//! The notification center, in ThingsBoard's shapes: **targets** (platform users by a
//! filter; a Slack or Microsoft Teams incoming webhook; a signed webhook), **templates**
//! (per delivery method: `WEB` inbox, `EMAIL`, `SLACK`, `MICROSOFT_TEAMS`, `WEBHOOK`, with
//! `${…}` fields of the event) and **rules** (`ALARM`: created, severity changed,
//! acknowledged, cleared; `DEVICE_ACTIVITY`: active, inactive) of a tenant.
//!
//! An event ([`Event`], from the alarms and from device activity) goes through a bounded
//! queue to one task, which writes a **request** per matching rule (the delivery log: each
//! delivery's recipient, method, attempts, last error, outcome) before anything is sent,
//! then delivers in the background with retries and a doubling backoff. A restart goes on
//! with the requests still in progress. A slow or dead webhook or SMTP server holds only
//! its own delivery task (at most [`PARALLEL`] at once); events are never waited on by
//! ingest beyond the queue's room. Each rule sends at most
//! `notifications.per_rule_per_minute`; more are logged as rate-limited.

pub mod smtp;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use gridlinks_storage::{DocKind, DocRecord, StoreError, WriteOp};
use gridlinks_types::Ts;
use parking_lot::Mutex;
use serde_json::{json, Value as J};
use tokio::sync::{mpsc, Semaphore};
use uuid::Uuid;

use crate::alarms::Alarm;
use crate::auth::{Authority, Caller};
use crate::config::NotificationsConfig;
use crate::core::{Core, Platform};
use crate::entities::{blocking, hidden, written_doc, ServiceError, ServiceResult};

/// Deliveries running at once.
pub const PARALLEL: usize = 16;
/// Events queued before their senders wait.
const QUEUE: usize = 4096;
/// Longest wait between two tries of a delivery.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// What happened to an alarm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlarmAction {
    /// Raised.
    Created,
    /// Re-graded.
    SeverityChanged,
    /// Acknowledged.
    Acknowledged,
    /// Cleared.
    Cleared,
}

impl AlarmAction {
    /// As a rule's `notifyOn` names it.
    pub fn name(self) -> &'static str {
        match self {
            AlarmAction::Created => "CREATED",
            AlarmAction::SeverityChanged => "SEVERITY_CHANGED",
            AlarmAction::Acknowledged => "ACKNOWLEDGED",
            AlarmAction::Cleared => "CLEARED",
        }
    }

    /// As the `${action}` field shows it.
    fn text(self) -> &'static str {
        match self {
            AlarmAction::Created => "created",
            AlarmAction::SeverityChanged => "severity changed",
            AlarmAction::Acknowledged => "acknowledged",
            AlarmAction::Cleared => "cleared",
        }
    }
}

/// Something that may notify.
#[derive(Clone, Debug)]
pub enum Event {
    /// An alarm changed.
    Alarm(Arc<Alarm>, AlarmAction),
    /// A device became active (`true`) or inactive.
    Activity(gridlinks_types::DeviceId, bool),
}

/// Where events are sent; cheap to clone.
#[derive(Clone)]
pub struct Sender(mpsc::Sender<Event>);

/// The other end, for [`start`].
pub struct Receiver(mpsc::Receiver<Event>);

/// A sender and its receiver.
pub fn channel() -> (Sender, Receiver) {
    let (tx, rx) = mpsc::channel(QUEUE);
    (Sender(tx), Receiver(rx))
}

impl Sender {
    /// Queues an event, waiting for room.
    pub async fn send(&self, e: Event) {
        // Closed only while the server stops.
        let _ = self.0.send(e).await;
    }
}

// ---- validation -------------------------------------------------------------------

fn invalid(m: impl Into<String>) -> ServiceError {
    ServiceError::Invalid(m.into())
}

/// Target configuration types.
const TARGET_TYPES: [&str; 4] = ["PLATFORM_USERS", "SLACK", "MICROSOFT_TEAMS", "WEBHOOK"];
/// Delivery methods a template may hold.
pub const METHODS: [&str; 5] = ["WEB", "EMAIL", "SLACK", "MICROSOFT_TEAMS", "WEBHOOK"];
/// Fields every template may use.
const RECIPIENT_FIELDS: [&str; 3] = ["recipientEmail", "recipientFirstName", "recipientLastName"];
/// Fields of an `ALARM` template (besides `details.…`).
const ALARM_FIELDS: [&str; 9] = [
    "alarmType",
    "action",
    "alarmId",
    "alarmSeverity",
    "alarmStatus",
    "alarmOriginatorEntityType",
    "alarmOriginatorName",
    "alarmOriginatorLabel",
    "alarmOriginatorId",
];
/// Fields of a `DEVICE_ACTIVITY` template.
const ACTIVITY_FIELDS: [&str; 5] = ["deviceId", "deviceName", "deviceLabel", "deviceType", "eventType"];

fn url_field(at: &str, c: &J, name: &str) -> ServiceResult<()> {
    let url = c.get(name).and_then(J::as_str).unwrap_or_default();
    if !(url.starts_with("https://") || url.starts_with("http://")) || url.len() > 2048 {
        return Err(invalid(format!("{at}.{name} must be an http(s) URL")));
    }
    Ok(())
}

/// Checks a target's `configuration` for `tenant`.
async fn check_target(core: &Core, platform: &Platform, tenant: Uuid, c: &J) -> ServiceResult<()> {
    let kind = c.get("type").and_then(J::as_str).unwrap_or_default();
    match kind {
        "PLATFORM_USERS" => {
            let f = c.get("usersFilter").ok_or_else(|| invalid("configuration.usersFilter is required"))?;
            match f.get("type").and_then(J::as_str).unwrap_or_default() {
                "TENANT_ADMINISTRATORS" | "ORIGINATOR_ENTITY_OWNER_USERS" | "ALL_USERS" => {}
                "USER_LIST" => {
                    let ids = f
                        .get("usersIds")
                        .and_then(J::as_array)
                        .ok_or_else(|| invalid("usersFilter.usersIds is required"))?;
                    for id in ids {
                        let id: Uuid = id
                            .as_str()
                            .and_then(|s| s.parse().ok())
                            .ok_or_else(|| invalid("usersIds holds user ids"))?;
                        let ok = platform.auth.users.by_id(id).is_some_and(|u| u.caller.tenant == tenant);
                        if !ok {
                            return Err(ServiceError::NotFound(format!("User with id [{id}] is not found")));
                        }
                    }
                }
                "CUSTOMER_USERS" => {
                    let id = f.get("customerId").and_then(J::as_str).and_then(|s| s.parse().ok());
                    let id: Uuid = id.ok_or_else(|| invalid("usersFilter.customerId is required"))?;
                    let store = core.store.clone();
                    let c = blocking(move || store.doc(DocKind::Customer, id)).await?;
                    if c.is_none_or(|c| core.doc_tenant(&c) != tenant) {
                        return Err(ServiceError::NotFound(format!("Customer with id [{id}] is not found")));
                    }
                }
                other => {
                    return Err(invalid(format!(
                        "usersFilter.type {other:?}: TENANT_ADMINISTRATORS, CUSTOMER_USERS, USER_LIST, \
                         ORIGINATOR_ENTITY_OWNER_USERS or ALL_USERS"
                    )))
                }
            }
        }
        "SLACK" | "MICROSOFT_TEAMS" => {
            if kind == "SLACK" && c.get("webhookUrl").is_none() {
                return Err(invalid(
                    "configuration.webhookUrl is required: GridLinks posts to a Slack incoming webhook (a Slack app's \
                     bot token and conversation are not supported)",
                ));
            }
            url_field("configuration", c, "webhookUrl")?;
        }
        "WEBHOOK" => url_field("configuration", c, "url")?,
        other => return Err(invalid(format!("configuration.type {other:?}: one of {}", TARGET_TYPES.join(", ")))),
    }
    Ok(())
}

/// The `${…}` names of a template text.
fn fields(t: &str) -> impl Iterator<Item = &str> {
    t.split("${").skip(1).filter_map(|rest| rest.split_once('}').map(|(name, _)| name))
}

/// Checks a template's type and delivery methods; unknown `${…}` fields are refused.
fn check_template(kind: &str, c: &J) -> ServiceResult<()> {
    let known: &[&str] = match kind {
        "ALARM" => &ALARM_FIELDS,
        "DEVICE_ACTIVITY" => &ACTIVITY_FIELDS,
        other => return Err(invalid(format!("notificationType {other:?}: ALARM or DEVICE_ACTIVITY"))),
    };
    let methods = c
        .get("deliveryMethodsTemplates")
        .and_then(J::as_object)
        .ok_or_else(|| invalid("configuration.deliveryMethodsTemplates is required"))?;
    let mut enabled = 0;
    for (method, t) in methods {
        if !METHODS.contains(&method.as_str()) {
            return Err(invalid(format!("delivery method {method:?}: one of {}", METHODS.join(", "))));
        }
        if t.get("enabled").and_then(J::as_bool) == Some(false) {
            continue;
        }
        enabled += 1;
        let body = t.get("body").and_then(J::as_str).unwrap_or_default();
        if body.trim().is_empty() {
            return Err(invalid(format!("deliveryMethodsTemplates.{method}.body is required")));
        }
        let subject = t.get("subject").and_then(J::as_str).unwrap_or_default();
        if method == "EMAIL" && subject.trim().is_empty() {
            return Err(invalid("deliveryMethodsTemplates.EMAIL.subject is required"));
        }
        for f in fields(body).chain(fields(subject)) {
            let ok =
                known.contains(&f) || RECIPIENT_FIELDS.contains(&f) || (kind == "ALARM" && f.starts_with("details."));
            if !ok {
                return Err(invalid(format!(
                    "deliveryMethodsTemplates.{method}: unknown field ${{{f}}} for {kind} (known: {}, {})",
                    known.join(", "),
                    RECIPIENT_FIELDS.join(", ")
                )));
            }
        }
    }
    if enabled == 0 {
        return Err(invalid("a template needs at least one enabled delivery method"));
    }
    Ok(())
}

fn uuids(v: Option<&J>) -> Vec<Uuid> {
    v.and_then(J::as_array).into_iter().flatten().filter_map(|x| x.as_str()?.parse().ok()).collect()
}

fn strings(v: Option<&J>) -> Vec<String> {
    v.and_then(J::as_array).into_iter().flatten().filter_map(|x| x.as_str().map(str::to_owned)).collect()
}

/// A rule's target ids, of every escalation step.
fn rule_targets(rule: &J) -> Vec<Uuid> {
    escalation(rule).into_iter().flat_map(|(_, targets)| targets).collect()
}

/// Longest escalation delay, seconds (a week).
const MAX_ESCALATION: u64 = 7 * 24 * 3600;

/// Who a rule notifies when: `(delay ms, targets)`; an `ALARM` rule's `escalationTable`
/// (delays in seconds), else its `targets` at once.
fn escalation(rule: &J) -> Vec<(i64, Vec<Uuid>)> {
    let r = rule.get("recipientsConfig");
    let mut out = vec![(0, uuids(r.and_then(|r| r.get("targets"))))];
    if let Some(table) = r.and_then(|r| r.get("escalationTable")).and_then(J::as_object) {
        for (delay, v) in table {
            if let Ok(secs) = delay.parse::<u64>() {
                out.push((secs.min(MAX_ESCALATION) as i64 * 1000, uuids(Some(v))));
            }
        }
    }
    out.retain(|(_, t)| !t.is_empty());
    out.sort_by_key(|(d, _)| *d);
    out
}

/// The id of a document a rule names by `{"id": …}` or a bare string.
fn id_of(v: Option<&J>) -> Option<Uuid> {
    v.and_then(|v| v.get("id").or(Some(v))).and_then(J::as_str).and_then(|s| s.parse().ok())
}

// ---- the entity services --------------------------------------------------------

/// A notification document kind by the name its API uses.
fn missing(kind: DocKind, id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("{} with id [{id}] is not found", kind.name()))
}

fn admin_only(me: &Caller) -> ServiceResult<()> {
    match me.authority {
        Authority::TenantAdmin => Ok(()),
        _ => Err(ServiceError::Forbidden),
    }
}

/// A notification target, template, rule or request of the caller's tenant.
pub async fn get(core: &Core, me: &Caller, kind: DocKind, id: Uuid) -> ServiceResult<DocRecord> {
    admin_only(me)?;
    let store = core.store.clone();
    let d = blocking(move || store.doc(kind, id)).await?.ok_or_else(|| missing(kind, id))?;
    let tenant = core.doc_tenant(&d);
    if tenant != me.tenant {
        return Err(hidden(me, tenant, || missing(kind, id)));
    }
    Ok(d)
}

/// The caller's tenant's documents of `kind`.
pub async fn list(core: &Core, me: &Caller, kind: DocKind) -> ServiceResult<Vec<DocRecord>> {
    admin_only(me)?;
    let store = core.store.clone();
    let mut all = blocking(move || store.docs(kind)).await?;
    all.retain(|d| core.doc_tenant(d) == me.tenant);
    Ok(all)
}

/// Saves a target, template or rule of the caller's tenant (`id`: an update), checked as
/// its kind needs. A webhook's `secret` is kept when an update leaves it out.
pub async fn save(
    p: &Platform,
    me: &Caller,
    kind: DocKind,
    id: Option<Uuid>,
    name: String,
    mut doc: J,
) -> ServiceResult<DocRecord> {
    let core = &p.core;
    admin_only(me)?;
    if name.trim().is_empty() {
        return Err(invalid(format!("{} name should be specified!", kind.name())));
    }
    let old = match id {
        Some(id) => Some(get(core, me, kind, id).await?),
        None => None,
    };
    let obj = doc.as_object_mut().ok_or_else(|| invalid("Invalid request body: a JSON object"))?;
    for f in ["id", "createdTime", "tenantId", "name"] {
        obj.remove(f);
    }
    match kind {
        DocKind::NotificationTarget => {
            let c = obj.get_mut("configuration").ok_or_else(|| invalid("configuration is required"))?;
            check_target(core, p, me.tenant, c).await?;
            // A webhook's signing key is write-only: an update without one keeps the old.
            let old_secret = old.as_ref().and_then(|o| o.doc.get("configuration")?.get("secret").cloned());
            let keep = c.get("secret").is_none_or(J::is_null);
            if let (Some(c), true) = (c.as_object_mut(), keep) {
                match old_secret {
                    Some(s) => c.insert("secret".into(), s),
                    None => c.remove("secret"),
                };
            }
        }
        DocKind::NotificationTemplate => {
            let kind = obj.get("notificationType").and_then(J::as_str).unwrap_or_default().to_owned();
            check_template(&kind, obj.get("configuration").unwrap_or(&J::Null))?;
        }
        DocKind::NotificationRule => check_rule(core, me, obj).await?,
        _ => return Err(ServiceError::Forbidden),
    }
    core.set_doc_tenant(&mut doc, me.tenant);
    written_doc(core.writer.submit(WriteOp::SaveDoc { kind, id, title: name, doc }).await?)
}

async fn check_rule(core: &Core, me: &Caller, r: &serde_json::Map<String, J>) -> ServiceResult<()> {
    let t = r.get("triggerType").and_then(J::as_str).unwrap_or_default();
    let same = |k: &str| r.get(k).and_then(|c| c.get("triggerType")).and_then(J::as_str) == Some(t);
    if !same("triggerConfig") || !same("recipientsConfig") {
        return Err(invalid("triggerType, triggerConfig.triggerType and recipientsConfig.triggerType must be equal"));
    }
    let tc = &r["triggerConfig"];
    let on = strings(tc.get("notifyOn"));
    match t {
        "ALARM" => {
            let known = ["CREATED", "SEVERITY_CHANGED", "ACKNOWLEDGED", "CLEARED"];
            if on.is_empty() || on.iter().any(|o| !known.contains(&o.as_str())) {
                return Err(invalid(format!("triggerConfig.notifyOn: some of {}", known.join(", "))));
            }
            for s in strings(tc.get("alarmSeverities")) {
                crate::alarms::Severity::parse(&s)
                    .ok_or_else(|| invalid(format!("alarmSeverities: {s:?} is no severity")))?;
            }
            let table = r["recipientsConfig"].get("escalationTable").and_then(J::as_object);
            let table = table.ok_or_else(|| invalid("recipientsConfig.escalationTable is required"))?;
            if table.keys().any(|k| k.parse::<u64>().ok().is_none_or(|secs| secs > MAX_ESCALATION)) {
                return Err(invalid(format!(
                    "recipientsConfig.escalationTable: its keys are delays in seconds, 0 to {MAX_ESCALATION}"
                )));
            }
            crate::alarms::search_statuses(&strings(tc.get("clearRule").and_then(|c| c.get("alarmStatuses"))))
                .map_err(|e| invalid(format!("triggerConfig.clearRule.alarmStatuses: {e}")))?;
        }
        "DEVICE_ACTIVITY" => {
            if on.is_empty() || on.iter().any(|o| o != "ACTIVE" && o != "INACTIVE") {
                return Err(invalid("triggerConfig.notifyOn: some of ACTIVE, INACTIVE"));
            }
        }
        other => return Err(invalid(format!("triggerType {other:?}: ALARM or DEVICE_ACTIVITY"))),
    }
    let template = id_of(r.get("templateId")).ok_or_else(|| invalid("templateId is required"))?;
    let tpl = get(core, me, DocKind::NotificationTemplate, template).await?;
    if tpl.doc.get("notificationType").and_then(J::as_str) != Some(t) {
        return Err(invalid(format!("the template is not a {t} template")));
    }
    let targets = rule_targets(&J::Object(r.clone()));
    if targets.is_empty() {
        return Err(invalid("recipientsConfig names no target"));
    }
    for target in targets {
        get(core, me, DocKind::NotificationTarget, target).await?;
    }
    Ok(())
}

/// Deletes a target, template or rule of the caller's tenant; a target or template a
/// rule uses is refused.
pub async fn delete(core: &Core, me: &Caller, kind: DocKind, id: Uuid) -> ServiceResult<()> {
    get(core, me, kind, id).await?;
    if kind == DocKind::NotificationTarget || kind == DocKind::NotificationTemplate {
        for r in list(core, me, DocKind::NotificationRule).await? {
            let uses = match kind {
                DocKind::NotificationTarget => rule_targets(&r.doc).contains(&id),
                _ => id_of(r.doc.get("templateId")) == Some(id),
            };
            if uses {
                return Err(invalid(format!("{} is used by the rule '{}'", kind.name(), r.title)));
            }
        }
    }
    core.writer.submit(WriteOp::DeleteDoc(kind, id)).await?;
    Ok(())
}

/// The caller's inbox (`WEB` notifications), newest first.
pub async fn inbox(core: &Core, me: &Caller, unread_only: bool) -> ServiceResult<Vec<DocRecord>> {
    let store = core.store.clone();
    let mine = me.user.to_string();
    let mut all = blocking(move || store.docs(DocKind::Notification)).await?;
    all.retain(|n| n.title == mine && (!unread_only || n.doc.get("status").and_then(J::as_str) != Some("READ")));
    all.sort_by_key(|n| std::cmp::Reverse(n.created_time));
    Ok(all)
}

/// Marks the caller's notification `id` read (`None`: all of them).
pub async fn mark_read(core: &Core, me: &Caller, id: Option<Uuid>) -> ServiceResult<()> {
    if let Some(id) = id {
        if !inbox(core, me, false).await?.iter().any(|n| n.id == id) {
            return Err(missing(DocKind::Notification, id));
        }
    }
    for n in inbox(core, me, true).await? {
        if id.is_none_or(|id| id == n.id) {
            let mut doc = n.doc;
            doc["status"] = "READ".into();
            core.writer.submit(WriteOp::PutDoc { kind: DocKind::Notification, id: n.id, title: n.title, doc }).await?;
        }
    }
    Ok(())
}

/// Deletes the caller's notification `id`.
pub async fn delete_notification(core: &Core, me: &Caller, id: Uuid) -> ServiceResult<()> {
    let store = core.store.clone();
    let n = blocking(move || store.doc(DocKind::Notification, id)).await?;
    match n {
        Some(n) if n.title == me.user.to_string() => {
            core.writer.submit(WriteOp::DeleteDoc(DocKind::Notification, id)).await?;
            Ok(())
        }
        _ => Err(missing(DocKind::Notification, id)),
    }
}

// ---- the notifier ----------------------------------------------------------------

/// One delivery of a request.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delivery {
    /// `WEB`, `EMAIL`, `SLACK`, `MICROSOFT_TEAMS` or `WEBHOOK`.
    method: String,
    /// The target it comes from.
    target: Uuid,
    /// The user (platform users), else none.
    #[serde(default)]
    recipient: Option<Uuid>,
    /// Where: the e-mail address, or the webhook's host.
    to: String,
    subject: String,
    text: String,
    /// `PENDING`, `SENT` or `FAILED`.
    status: String,
    attempts: u32,
    #[serde(default)]
    last_error: Option<String>,
    #[serde(default)]
    sent_at: Option<i64>,
    /// Not before this time, ms (an escalation's delay).
    #[serde(default)]
    not_before: i64,
}

struct Runner {
    p: Arc<Platform>,
    cfg: NotificationsConfig,
    smtp_password: Option<String>,
    /// Per rule: the minute and how many it sent in it.
    sent: Mutex<HashMap<Uuid, (i64, u32)>>,
    slots: Semaphore,
}

/// Starts the notifier on `rx`: events in, requests and deliveries out; it goes on with
/// the requests a previous run left in progress.
pub fn start(p: Arc<Platform>, rx: Receiver) -> Result<tokio::task::JoinHandle<()>, StoreError> {
    let cfg = p.core.cfg.notifications.clone();
    let smtp_password = match cfg.smtp.password_file.as_os_str().is_empty() {
        true => None,
        false => match crate::cluster::secret_file(&cfg.smtp.password_file, "notifications.smtp.password_file") {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "e-mail notifications will fail");
                None
            }
        },
    };
    let r = Arc::new(Runner { p, cfg, smtp_password, sent: Mutex::default(), slots: Semaphore::new(PARALLEL) });
    let unfinished: Vec<DocRecord> =
        r.p.core
            .store
            .docs(DocKind::NotificationRequest)?
            .into_iter()
            .filter(|d| d.doc.get("status").and_then(J::as_str) == Some("PROCESSING"))
            .collect();
    Ok(tokio::spawn(async move {
        for req in unfinished {
            tokio::spawn(r.clone().deliver(req));
        }
        let mut rx = rx.0;
        while let Some(e) = rx.recv().await {
            if let Err(e) = r.clone().event(e).await {
                tracing::warn!(error = %e, "notifications: an event was not handled");
            }
        }
    }))
}

/// An event's fields for templates, its tenant, its originator's customer, and what a
/// rule's trigger looks at.
struct Fields {
    tenant: Uuid,
    customer: Option<Uuid>,
    trigger: &'static str,
    values: HashMap<String, String>,
    info: J,
}

impl Runner {
    async fn fields(&self, e: &Event) -> ServiceResult<Option<Fields>> {
        let store = self.p.core.store.clone();
        Ok(Some(match e {
            Event::Alarm(a, action) => {
                let (kind, id) = (a.originator.kind.clone(), a.originator.id);
                let names = blocking(move || {
                    Ok(match kind.as_str() {
                        "DEVICE" => store.device(gridlinks_types::DeviceId(id))?.map(|d| (d.name, d.label)),
                        _ => store.doc(DocKind::Asset, id)?.map(|d| (d.title, None)),
                    })
                })
                .await?
                .unwrap_or_default();
                let mut v: HashMap<String, String> = [
                    ("alarmType", a.alarm_type.clone()),
                    ("action", action.text().to_owned()),
                    ("alarmId", a.id.to_string()),
                    ("alarmSeverity", a.severity.name().to_lowercase()),
                    ("alarmStatus", a.status().name().to_owned()),
                    ("alarmOriginatorEntityType", a.originator.kind.clone()),
                    ("alarmOriginatorName", names.0),
                    ("alarmOriginatorLabel", names.1.unwrap_or_default()),
                    ("alarmOriginatorId", a.originator.id.to_string()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
                if let Some(d) = a.details.as_object() {
                    for (k, x) in d {
                        v.insert(format!("details.{k}"), x.as_str().map_or_else(|| x.to_string(), str::to_owned));
                    }
                }
                let info = json!({"type": "ALARM", "action": action.name(), "alarmId": a.id,
                    "alarmType": a.alarm_type, "alarmSeverity": a.severity.name(), "alarmStatus": a.status().name(),
                    "alarmOriginator": {"entityType": a.originator.kind, "id": a.originator.id}});
                Fields { tenant: a.tenant, customer: a.customer, trigger: "ALARM", values: v, info }
            }
            Event::Activity(device, active) => {
                let id = *device;
                let Some(d) = blocking(move || store.device(id)).await? else { return Ok(None) };
                let event = if *active { "active" } else { "inactive" };
                let v: HashMap<String, String> = [
                    ("deviceId", d.id.to_string()),
                    ("deviceName", d.name.clone()),
                    ("deviceLabel", d.label.clone().unwrap_or_default()),
                    ("deviceType", d.device_type.clone()),
                    ("eventType", event.to_owned()),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
                let info = json!({"type": "DEVICE_ACTIVITY", "eventType": event.to_uppercase(), "deviceId": d.id,
                    "deviceName": d.name, "deviceProfileId": d.profile_id().0});
                Fields {
                    tenant: self.p.core.tenant_of(d.tenant),
                    customer: d.customer,
                    trigger: "DEVICE_ACTIVITY",
                    values: v,
                    info,
                }
            }
        }))
    }

    /// Whether `rule`'s trigger takes `e`.
    fn matches(rule: &J, e: &Event) -> bool {
        let tc = rule.get("triggerConfig").unwrap_or(&J::Null);
        let on = strings(tc.get("notifyOn"));
        match e {
            Event::Alarm(a, action) => {
                let (types, sevs) = (strings(tc.get("alarmTypes")), strings(tc.get("alarmSeverities")));
                on.iter().any(|o| o == action.name())
                    && (types.is_empty() || types.contains(&a.alarm_type))
                    && (sevs.is_empty() || sevs.iter().any(|s| s == a.severity.name()))
            }
            Event::Activity(device, active) => {
                let devices = uuids(tc.get("devices"));
                on.iter().any(|o| o == if *active { "ACTIVE" } else { "INACTIVE" })
                    && (devices.is_empty() || devices.contains(&device.0))
            }
        }
    }

    async fn event(self: Arc<Self>, e: Event) -> ServiceResult<()> {
        let Some(f) = self.fields(&e).await? else { return Ok(()) };
        let store = self.p.core.store.clone();
        let rules = blocking(move || store.docs(DocKind::NotificationRule)).await?;
        for rule in rules {
            let enabled = rule.doc.get("enabled").and_then(J::as_bool) != Some(false);
            let trigger = rule.doc.get("triggerType").and_then(J::as_str);
            if !enabled
                || self.p.core.doc_tenant(&rule) != f.tenant
                || trigger != Some(f.trigger)
                || !Self::matches(&rule.doc, &e)
            {
                continue;
            }
            if let Event::Activity(device, _) = &e {
                let profiles = uuids(rule.doc.get("triggerConfig").and_then(|t| t.get("deviceProfiles")));
                if !profiles.is_empty() {
                    let (store, id) = (self.p.core.store.clone(), *device);
                    let profile = blocking(move || store.device(id)).await?.map(|d| d.profile_id().0);
                    if !profile.is_some_and(|p| profiles.contains(&p)) {
                        continue;
                    }
                }
            }
            let req = self.request(&rule, &f).await?;
            tokio::spawn(self.clone().deliver(req));
        }
        Ok(())
    }

    /// Whether `rule` may send one more this minute.
    fn allowed(&self, rule: Uuid) -> bool {
        let minute = Ts::now().0 / 60_000;
        let mut sent = self.sent.lock();
        let e = sent.entry(rule).or_insert((minute, 0));
        if e.0 != minute {
            *e = (minute, 0);
        }
        e.1 += 1;
        e.1 <= self.cfg.per_rule_per_minute
    }

    /// Writes the request of `rule` for the event: its deliveries, rendered.
    async fn request(&self, rule: &DocRecord, f: &Fields) -> ServiceResult<DocRecord> {
        let core = &self.p.core;
        let template_id = id_of(rule.doc.get("templateId"));
        let store = core.store.clone();
        let template = match template_id {
            Some(id) => blocking(move || store.doc(DocKind::NotificationTemplate, id)).await?,
            None => None,
        };
        let methods = template
            .as_ref()
            .and_then(|t| t.doc.get("configuration")?.get("deliveryMethodsTemplates")?.as_object().cloned())
            .unwrap_or_default();
        let enabled = |m: &str| methods.get(m).filter(|t| t.get("enabled").and_then(J::as_bool) != Some(false));
        let mut deliveries = Vec::new();
        let mut error = None;
        if !self.allowed(rule.id) {
            error = Some(format!(
                "rate-limited: the rule sent notifications.per_rule_per_minute ({}) this minute",
                self.cfg.per_rule_per_minute
            ));
        }
        let now = Ts::now().0;
        for (delay, target_id) in
            escalation(&rule.doc).into_iter().flat_map(|(d, ts)| ts.into_iter().map(move |t| (d, t)))
        {
            let store = core.store.clone();
            let Some(target) = blocking(move || store.doc(DocKind::NotificationTarget, target_id)).await? else {
                continue;
            };
            let c = target.doc.get("configuration").cloned().unwrap_or_default();
            let mut add = |method: &str, recipient: Option<&Caller>, to: String| {
                if let Some(t) = enabled(method) {
                    let mut values = f.values.clone();
                    if let Some(u) = recipient {
                        values.insert("recipientEmail".into(), u.email.clone());
                    }
                    let render = |s: Option<&J>| render(s.and_then(J::as_str).unwrap_or_default(), &values);
                    deliveries.push(Delivery {
                        method: method.to_owned(),
                        target: target_id,
                        recipient: recipient.map(|u| u.user),
                        to,
                        subject: render(t.get("subject")),
                        text: render(t.get("body")),
                        status: "PENDING".into(),
                        attempts: 0,
                        last_error: None,
                        sent_at: None,
                        not_before: now + delay,
                    });
                }
            };
            match c.get("type").and_then(J::as_str).unwrap_or_default() {
                "PLATFORM_USERS" => {
                    for u in self.users(&c, f) {
                        add("WEB", Some(&u), u.email.clone());
                        add("EMAIL", Some(&u), u.email.clone());
                    }
                }
                "SLACK" => add("SLACK", None, host_of(c.get("webhookUrl"))),
                "MICROSOFT_TEAMS" => add("MICROSOFT_TEAMS", None, host_of(c.get("webhookUrl"))),
                "WEBHOOK" => add("WEBHOOK", None, host_of(c.get("url"))),
                _ => {}
            }
        }
        let status = if error.is_some() { "RATE_LIMITED" } else { "PROCESSING" };
        let mut doc = json!({
            "ruleId": rule.id, "ruleName": rule.title, "templateId": template_id, "info": f.info,
            "status": status, "error": error, "deliveries": deliveries,
        });
        core.set_doc_tenant(&mut doc, f.tenant);
        let op =
            WriteOp::PutDoc { kind: DocKind::NotificationRequest, id: Uuid::new_v4(), title: rule.title.clone(), doc };
        written_doc(core.writer.submit(op).await?)
    }

    /// The users a `PLATFORM_USERS` target names, for an event of `f`'s tenant.
    fn users(&self, c: &J, f: &Fields) -> Vec<Caller> {
        let filter = c.get("usersFilter").unwrap_or(&J::Null);
        let of_tenant = |u: &Caller| u.tenant == f.tenant && u.authority != Authority::SysAdmin;
        let all: Vec<Caller> =
            self.p.auth.users.all().into_iter().map(|u| u.caller.clone()).filter(of_tenant).collect();
        let admins = |u: &Caller| u.authority == Authority::TenantAdmin;
        let customer = |c: Option<Uuid>| move |u: &Caller| u.authority == Authority::CustomerUser && u.customer == c;
        match filter.get("type").and_then(J::as_str).unwrap_or_default() {
            "TENANT_ADMINISTRATORS" => all.into_iter().filter(admins).collect(),
            "ALL_USERS" => all,
            "USER_LIST" => {
                let ids = uuids(filter.get("usersIds"));
                all.into_iter().filter(|u| ids.contains(&u.user)).collect()
            }
            "CUSTOMER_USERS" => {
                let c = filter.get("customerId").and_then(J::as_str).and_then(|s| s.parse().ok());
                all.into_iter().filter(customer(c)).collect()
            }
            "ORIGINATOR_ENTITY_OWNER_USERS" => match f.customer {
                Some(c) => all.into_iter().filter(customer(Some(c))).collect(),
                None => all.into_iter().filter(admins).collect(),
            },
            _ => Vec::new(),
        }
    }

    /// Runs a request's pending deliveries, with retries, writing each outcome.
    async fn deliver(self: Arc<Self>, req: DocRecord) {
        let mut deliveries: Vec<Delivery> =
            req.doc.get("deliveries").and_then(|d| serde_json::from_value(d.clone()).ok()).unwrap_or_default();
        deliveries.sort_by_key(|d| d.not_before);
        let tenant = self.p.core.doc_tenant(&req);
        for i in 0..deliveries.len() {
            let wait = deliveries[i].not_before - Ts::now().0;
            if deliveries[i].status == "PENDING" && wait > 0 {
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
            }
            if deliveries[i].status == "PENDING" && deliveries[i].not_before > req.created_time {
                if let Some(why) = self.escalation_ended(&req).await {
                    deliveries[i].status = "CANCELLED".into();
                    deliveries[i].last_error = Some(why);
                    self.save(&req, &deliveries, false).await;
                }
            }
            let mut delay = self.cfg.retry_delay.duration();
            while deliveries[i].status == "PENDING" {
                deliveries[i].attempts += 1;
                // A slot for the try only: a receiver that keeps failing holds none while it waits.
                let sent = match self.slots.acquire().await {
                    Ok(_slot) => self.send(&req, tenant, &deliveries[i]).await,
                    Err(_) => return,
                };
                match sent {
                    Ok(()) => {
                        deliveries[i].status = "SENT".into();
                        deliveries[i].sent_at = Some(Ts::now().0);
                    }
                    Err(e) => {
                        deliveries[i].last_error = Some(e.clone());
                        if deliveries[i].attempts >= self.cfg.max_attempts {
                            deliveries[i].status = "FAILED".into();
                            tracing::warn!(request = %req.id, method = %deliveries[i].method, error = %e, "notification delivery failed");
                        }
                    }
                }
                self.save(&req, &deliveries, false).await;
                if deliveries[i].status == "PENDING" {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(MAX_BACKOFF);
                }
            }
        }
        self.save(&req, &deliveries, true).await;
    }

    /// Why an alarm's escalation stops before a later step (the alarm is gone, or its status
    /// is one of the rule's `clearRule.alarmStatuses`), if it does.
    async fn escalation_ended(&self, req: &DocRecord) -> Option<String> {
        let alarm: Uuid = req.doc["info"].get("alarmId")?.as_str()?.parse().ok()?;
        let Ok(Some(a)) = self.p.core.alarms.by_id(alarm) else { return Some("the alarm was deleted".into()) };
        let rule = id_of(req.doc.get("ruleId"))?;
        let store = self.p.core.store.clone();
        let rule = blocking(move || store.doc(DocKind::NotificationRule, rule)).await.ok()??;
        let stops = strings(rule.doc["triggerConfig"].get("clearRule").and_then(|c| c.get("alarmStatuses")));
        let statuses = crate::alarms::search_statuses(&stops).ok()?;
        (!stops.is_empty() && (statuses.is_empty() || statuses.contains(&a.status())))
            .then(|| format!("the alarm is {}: the rule's clearRule ends its escalation", a.status().name()))
    }

    /// Writes a request's deliveries (and, when `done`, its end).
    async fn save(&self, req: &DocRecord, deliveries: &[Delivery], done: bool) {
        let mut doc = req.doc.clone();
        doc["deliveries"] = serde_json::to_value(deliveries).unwrap_or_default();
        if done {
            doc["status"] = "SENT".into();
        }
        let op = WriteOp::PutDoc { kind: DocKind::NotificationRequest, id: req.id, title: req.title.clone(), doc };
        if let Err(e) = self.p.core.writer.submit(op).await {
            tracing::warn!(request = %req.id, error = %e, "notification request not written");
        }
    }

    /// One try of one delivery.
    async fn send(&self, req: &DocRecord, tenant: Uuid, d: &Delivery) -> Result<(), String> {
        let core = &self.p.core;
        let store = core.store.clone();
        let target_id = d.target;
        let target =
            blocking(move || store.doc(DocKind::NotificationTarget, target_id)).await.map_err(|e| e.to_string())?;
        let c = target.and_then(|t| t.doc.get("configuration").cloned()).unwrap_or_default();
        let timeout = self.cfg.timeout.duration();
        match d.method.as_str() {
            "WEB" => {
                let recipient = d.recipient.ok_or("a WEB notification without a recipient")?;
                let mut doc = json!({"requestId": req.id, "recipientId": recipient, "type": req.doc["info"]["type"],
                    "deliveryMethod": "WEB", "subject": d.subject, "text": d.text, "info": req.doc["info"],
                    "status": "SENT"});
                core.set_doc_tenant(&mut doc, tenant);
                // The same id for every try: a retry does not add a second copy.
                let id = Uuid::new_v5(&req.id, recipient.as_bytes());
                let op = WriteOp::PutDoc { kind: DocKind::Notification, id, title: recipient.to_string(), doc };
                core.writer.submit(op).await.map(drop).map_err(|e| e.to_string())
            }
            "EMAIL" => smtp::send(&self.cfg.smtp, self.smtp_password.as_deref(), timeout, &d.to, &d.subject, &d.text)
                .await
                .map_err(|e| e.to_string()),
            "SLACK" | "MICROSOFT_TEAMS" => {
                let url = c.get("webhookUrl").and_then(J::as_str).unwrap_or_default().to_owned();
                self.post(url, json!({"text": d.text}), None).await
            }
            "WEBHOOK" => {
                let url = c.get("url").and_then(J::as_str).unwrap_or_default().to_owned();
                let body = json!({"subject": d.subject, "text": d.text, "info": req.doc["info"], "requestId": req.id});
                let secret = c.get("secret").and_then(J::as_str).map(str::to_owned);
                self.post(url, body, secret).await
            }
            other => Err(format!("delivery method {other} is not built")),
        }
    }

    /// POSTs `body` to `url` (signed with `secret`: `X-GridLinks-Signature: sha256=…` of
    /// the timestamp, a dot and the body), off the async threads.
    async fn post(&self, url: String, body: J, secret: Option<String>) -> Result<(), String> {
        let (timeout, private) = (self.cfg.timeout.duration(), self.cfg.allow_private_addresses);
        let to = Destination { url, headers: Vec::new(), secret, timeout, allow_private: private };
        tokio::task::spawn_blocking(move || post(&to, &body.to_string(), "notifications"))
            .await
            .map_err(|e| e.to_string())?
    }
}

/// A webhook URL's host, as the delivery log shows where it went.
fn host_of(url: Option<&J>) -> String {
    let u = url.and_then(J::as_str).unwrap_or_default();
    u.split("://").nth(1).unwrap_or(u).split(['/', '?']).next().unwrap_or_default().to_owned()
}

/// `${name}` replaced by its value; an unknown name stays as it is.
fn render(t: &str, values: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        match rest[at + 2..].split_once('}') {
            Some((name, after)) => {
                match values.get(name) {
                    Some(v) => out.push_str(v),
                    None => out.push_str(&rest[at..at + 3 + name.len()]),
                }
                rest = after;
            }
            None => {
                out.push_str(&rest[at..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether an address is one a tenant's webhook may not reach by default.
pub(crate) fn private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v) => {
            v.is_loopback()
                || v.is_private()
                || v.is_link_local()
                || v.is_unspecified()
                || v.is_broadcast()
                || v.octets()[0] == 100 && (v.octets()[1] & 0xc0) == 64
        }
        IpAddr::V6(v) => {
            v.is_loopback()
                || v.is_unspecified()
                || (v.segments()[0] & 0xfe00) == 0xfc00
                || (v.segments()[0] & 0xffc0) == 0xfe80
                || v.to_ipv4_mapped().is_some_and(|m| private(IpAddr::V4(m)))
        }
    }
}

/// Where a webhook POST goes.
pub(crate) struct Destination {
    pub url: String,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// The key signing the body, if any.
    pub secret: Option<String>,
    pub timeout: Duration,
    /// Whether loopback, private and link-local addresses may be reached.
    pub allow_private: bool,
}

/// The addresses of `netloc` (`host:port`) a tenant may reach; an error names the setting
/// (`{section}.allow_private_addresses`) when only forbidden ones were found.
pub(crate) fn resolve(netloc: &str, allow_private: bool, section: &str) -> std::io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = netloc.to_socket_addrs()?.collect();
    let usable: Vec<SocketAddr> = addrs.iter().copied().filter(|a| allow_private || !private(a.ip())).collect();
    if usable.is_empty() && !addrs.is_empty() {
        return Err(std::io::Error::other(format!(
            "the address is loopback, private or link-local ({section}.allow_private_addresses is off)"
        )));
    }
    Ok(usable)
}

/// An HTTP client for webhooks: no redirects, and every connection's address checked by
/// [`resolve`] (`section` names the configuration section whose `allow_private_addresses`
/// applies, for the error). It keeps connections open for the next request.
pub(crate) fn agent(timeout: Duration, allow_private: bool, section: &'static str) -> ureq::Agent {
    let resolver = move |netloc: &str| resolve(netloc, allow_private, section);
    ureq::AgentBuilder::new().timeout(timeout).redirects(0).resolver(resolver).build()
}

/// Sends one webhook POST of a JSON `text` (blocking) with a new [`agent`].
fn post(to: &Destination, text: &str, section: &'static str) -> Result<(), String> {
    post_with(&agent(to.timeout, to.allow_private, section), to, text)
}

/// Sends one webhook POST of a JSON `text` through `agent` (blocking).
pub(crate) fn post_with(agent: &ureq::Agent, to: &Destination, text: &str) -> Result<(), String> {
    let mut req = agent.post(&to.url).set("Content-Type", "application/json").set("User-Agent", "GridLinks");
    for (k, v) in &to.headers {
        req = req.set(k, v);
    }
    if let Some(secret) = &to.secret {
        use hmac::Mac;
        let ts = Ts::now().0.to_string();
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).map_err(|e| e.to_string())?;
        mac.update(ts.as_bytes());
        mac.update(b".");
        mac.update(text.as_bytes());
        let sig: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
        req = req.set("X-GridLinks-Timestamp", &ts).set("X-GridLinks-Signature", &format!("sha256={sig}"));
    }
    match req.send_string(text) {
        Ok(_) => Ok(()),
        Err(ureq::Error::Status(code, r)) => {
            let said: String = r.into_string().unwrap_or_default().chars().take(200).collect();
            Err(format!("HTTP {code}: {said}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_known_fields_and_refuse_unknown_ones() {
        let v: HashMap<String, String> = [("alarmType".to_owned(), "Overheat".to_owned())].into_iter().collect();
        assert_eq!(render("${alarmType} on ${x} ${", &v), "Overheat on ${x} ${");
        let t =
            |body: &str| json!({"deliveryMethodsTemplates": {"WEB": {"enabled": true, "subject": "s", "body": body}}});
        assert!(check_template("ALARM", &t("${alarmType} ${details.data} ${recipientEmail}")).is_ok());
        let e = check_template("ALARM", &t("${temperature}")).unwrap_err().to_string();
        assert!(e.contains("unknown field ${temperature}"), "{e}");
        assert!(check_template("DEVICE_ACTIVITY", &t("${alarmType}")).is_err());
        assert!(check_template("ENTITY_ACTION", &t("x")).is_err());
        let email = json!({"deliveryMethodsTemplates": {"EMAIL": {"enabled": true, "body": "b"}}});
        assert!(check_template("ALARM", &email).unwrap_err().to_string().contains("subject"));
    }

    #[test]
    fn private_addresses_are_recognised() {
        for a in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.5",
            "169.254.1.1",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(private(a.parse().unwrap()), "{a}");
        }
        for a in ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888"] {
            assert!(!private(a.parse().unwrap()), "{a}");
        }
    }
}
