//! Users: which a caller manages (`Caller::may_manage`); creating and updating them,
//! activation (a link a new user sets its password with) and password changes; deleting.

use std::net::IpAddr;
use std::sync::Arc;

use gridlinks_storage::{DocKind, DocRecord, WriteOp};
use gridlinks_types::Ts;
use serde_json::Value as J;
use uuid::Uuid;

use super::{blocking, hidden, may_create, written_doc, ServiceError, ServiceResult};

use crate::auth::users::{self as u, Authority, Entry};
use crate::auth::{Auth, AuthError, Caller, TokenPair};
use crate::core::Core;

/// How long an activation link works, ms (ThingsBoard's default: 24 hours).
pub const ACTIVATION_TTL_MS: i64 = 24 * 3600 * 1000;
/// Password length bounds: ThingsBoard's default policy asks for 6; the upper bound keeps
/// hashing cheap.
pub const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 6..=256;

fn missing(id: Uuid) -> ServiceError {
    ServiceError::NotFound(format!("User with id [{id}] is not found"))
}

/// A user the caller manages (forbidden otherwise; not found when there is none or it is
/// of a tenant the caller may not learn of).
pub fn managed(auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<Arc<Entry>> {
    let e = auth.users.by_id(id).ok_or_else(|| missing(id))?;
    if !me.may_manage(&e.caller) {
        return Err(hidden(me, e.caller.tenant, || missing(id)));
    }
    Ok(e)
}

/// The user whose API keys the caller would manage: itself, or a user it manages.
pub fn keys_owner(auth: &Auth, me: &Caller, user: Uuid) -> ServiceResult<Caller> {
    let e = auth.users.by_id(user).ok_or_else(|| missing(user))?;
    if e.caller.user != me.user && !me.may_manage(&e.caller) {
        return Err(hidden(me, e.caller.tenant, || missing(user)));
    }
    Ok(e.caller.clone())
}

/// Deletes a user the caller manages (not itself, nor a user of the configuration): its
/// tokens and API keys stop working at once.
pub async fn delete(core: &Core, auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<()> {
    if id == me.user || managed(auth, me, id)?.configured {
        return Err(ServiceError::Invalid(
            "The administrator of the configuration, or yourself, cannot be deleted".into(),
        ));
    }
    core.writer.submit(WriteOp::DeleteDoc(DocKind::User, id)).await?;
    auth.users.remove(id);
    auth.api_keys.remove_user(id);
    Ok(())
}

/// A user as its administrator creates or changes it.
#[derive(Debug)]
pub struct NewUser {
    /// The user to change; `None` creates one.
    pub id: Option<Uuid>,
    /// Its login name, lower case.
    pub email: String,
    /// What it may do.
    pub authority: Authority,
    /// Its tenant when the system administrator names one (others: their own).
    pub tenant: Option<Uuid>,
    /// The customer of a customer user.
    pub customer: Option<Uuid>,
    /// The rest of ThingsBoard's user JSON (names, additional info).
    pub body: J,
}

fn valid_email(e: &str) -> bool {
    let mut parts = e.split('@');
    let (Some(local), Some(domain), None) = (parts.next(), parts.next(), parts.next()) else { return false };
    !local.is_empty()
        && !domain.is_empty()
        && e.len() <= 255
        && !e.chars().any(|c| c.is_whitespace() || c.is_control() || "<>()[],;:\"\\".contains(c))
}

fn invalid(m: impl Into<String>) -> ServiceError {
    ServiceError::Invalid(m.into())
}

async fn load(core: &Core, id: Uuid) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    blocking(move || store.doc(DocKind::User, id)).await?.ok_or_else(|| missing(id))
}

/// Writes `user`'s credentials document (same id as the user).
async fn write_credentials(core: &Core, user: Uuid, doc: J) -> ServiceResult<DocRecord> {
    let store = core.store.clone();
    let exists = blocking(move || store.doc(DocKind::UserCredentials, user)).await?.is_some();
    let (kind, title) = (DocKind::UserCredentials, "credentials".to_owned());
    let op = match exists {
        true => WriteOp::SaveDoc { kind, id: Some(user), title, doc },
        false => WriteOp::InsertDoc { kind, id: user, title, doc },
    };
    written_doc(core.writer.submit(op).await?)
}

/// Creates or updates a user the caller may manage: a tenant administrator its tenant's
/// administrators and customer users (of its customers), the system administrator tenant
/// administrators. Authority, tenant and customer never change; the users of the
/// configuration are changed there.
pub async fn save(core: &Core, auth: &Auth, me: &Caller, user: NewUser) -> ServiceResult<DocRecord> {
    let NewUser { id, email, authority, tenant, customer, body } = user;
    if !valid_email(&email) {
        return Err(invalid(format!("Invalid email address format '{email}'!")));
    }
    if auth.users.is_configured_email(&email) {
        return Err(invalid("User with such email already exists!"));
    }
    // The tenant: the caller's own; the system administrator names it.
    let tenant = match me.authority {
        Authority::SysAdmin => {
            let t = tenant.ok_or_else(|| invalid("A tenant administrator needs a tenantId"))?;
            let store = core.store.clone();
            if blocking(move || store.doc(DocKind::Tenant, t)).await?.is_none() {
                return Err(ServiceError::NotFound(format!("Tenant with id [{t}] is not found")));
            }
            t
        }
        _ => me.tenant,
    };
    let target = Caller { user: Uuid::nil(), email: email.clone(), authority, tenant, customer };
    if !me.may_manage(&target) {
        return Err(ServiceError::Forbidden);
    }
    match (authority, customer) {
        (Authority::CustomerUser, None) => return Err(invalid("A customer user needs a customerId")),
        (Authority::CustomerUser, Some(c)) => {
            let store = core.store.clone();
            match blocking(move || store.doc(DocKind::Customer, c)).await? {
                Some(d) if core.doc_tenant(&d) == tenant => {}
                // Another tenant's customer is answered as one that does not exist.
                Some(_) | None => return Err(ServiceError::NotFound(format!("Customer with id [{c}] is not found"))),
            }
        }
        (_, Some(_)) => return Err(invalid("A tenant administrator belongs to no customer")),
        (_, None) => {}
    }
    if let Some(id) = id {
        let old = managed(auth, me, id)?;
        if old.configured {
            return Err(invalid("The users of the configuration are changed in the configuration"));
        }
        if old.caller.authority != authority || old.caller.customer != customer || old.caller.tenant != tenant {
            return Err(invalid("A user's authority, tenant and customer cannot change"));
        }
        if id == me.user && old.caller.email != email {
            return Err(invalid("Change your own email by logging in as another administrator"));
        }
    }
    if id.is_none() {
        may_create(core, tenant, DocKind::User).await?;
    }
    let doc = u::user_doc(&email, authority, tenant, customer, &body);
    let user = written_doc(core.writer.submit(WriteOp::SaveDoc { kind: DocKind::User, id, title: email, doc }).await?)?;
    let uid = user.id;
    let store = core.store.clone();
    let credentials = match id {
        Some(_) => blocking(move || store.doc(DocKind::UserCredentials, uid)).await?,
        None => Some(write_credentials(core, uid, u::credentials_doc(None, false, None, "")).await?),
    };
    auth.users.put(&user, credentials.as_ref());
    Ok(user)
}

/// A fresh activation token for a user the caller manages that has not activated its
/// account (earlier tokens of the user stop working), valid for [`ACTIVATION_TTL_MS`]; only
/// its SHA-256 is stored.
pub async fn activation_token(core: &Core, auth: &Auth, me: &Caller, id: Uuid) -> ServiceResult<String> {
    let user = managed(auth, me, id)?;
    if user.hash.is_some() {
        return Err(invalid("User is already activated!"));
    }
    let token: String = (0..2).map(|_| gridlinks_storage::generate_token()).collect();
    let expires = Ts::now().0 + ACTIVATION_TTL_MS;
    let c = write_credentials(core, id, u::credentials_doc(None, false, Some((&u::token_hash(&token), expires)), ""))
        .await?;
    auth.users.put(&load(core, id).await?, Some(&c));
    Ok(token)
}

/// Sets `user`'s password (a new credentials stamp: its other logins end) and logs it in.
async fn set_password(core: &Core, auth: &Auth, user: &Entry, password: String) -> ServiceResult<TokenPair> {
    if !PASSWORD_LEN.contains(&password.chars().count()) {
        return Err(invalid(format!(
            "Password must be {} to {} characters long",
            PASSWORD_LEN.start(),
            PASSWORD_LEN.end()
        )));
    }
    let hash = auth.passwords.hash(password).await?;
    let doc = u::credentials_doc(Some(&hash), true, None, &u::new_stamp());
    let c = write_credentials(core, user.caller.user, doc).await?;
    auth.users.put(&load(core, user.caller.user).await?, Some(&c));
    let entry = auth.users.by_id(user.caller.user).ok_or_else(|| ServiceError::Internal("user vanished".into()))?;
    Ok(auth.start(&entry).await?)
}

/// Activates the account `token` was given for with its first password; logs it in.
pub async fn activate(core: &Core, auth: &Auth, token: &str, password: String) -> ServiceResult<TokenPair> {
    let user = auth
        .users
        .activation(token, Ts::now().0)
        .ok_or_else(|| ServiceError::NotFound("Invalid or expired activation token".into()))?;
    set_password(core, auth, &user, password).await
}

/// Changes the caller's own password, given its current one (checked like a login:
/// throttled per address and name); every other login of the user ends.
pub async fn change_password(
    core: &Core,
    auth: &Auth,
    me: &Caller,
    peer: IpAddr,
    current: &str,
    new: String,
) -> ServiceResult<TokenPair> {
    let user = auth.users.by_id(me.user).ok_or(AuthError::BadToken)?;
    if user.configured {
        return Err(invalid("The administrator's password is set by admin.password in the configuration"));
    }
    let name = user.caller.email.to_lowercase();
    auth.throttle.check(peer, &name).map_err(AuthError::Throttled)?;
    if !auth.passwords.verify(current.as_bytes(), user.hash.as_deref()).await? {
        auth.throttle.failed(peer, &name);
        return Err(invalid("Current password doesn't match!"));
    }
    auth.throttle.succeeded(peer, &name);
    set_password(core, auth, &user, new).await
}
