//! The one attribute-read path: the REST API's attribute values and keys, the HTTP device
//! API's `GET /api/v1/{token}/attributes` and the MQTT attribute request all read a
//! device's attributes here, off the async runtime. What a device asks for and the shape
//! of its answer are `gridlinks_thingsboard::attributes`.

use gridlinks_storage::{AttributeEntry, Store, StoreError};
use gridlinks_thingsboard::attributes::{device_response, AttributeRequest};
use gridlinks_types::{AttributeScope, DeviceId};
use serde_json::Value as J;

/// `device`'s attributes in `scope` (`None`: every scope), only `keys` (`None`: all).
pub async fn read(
    store: &Store,
    device: DeviceId,
    scope: Option<AttributeScope>,
    keys: Option<Vec<String>>,
) -> Result<Vec<AttributeEntry>, StoreError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.attributes(device, scope, keys.as_deref()))
        .await
        // The blocking pool is gone only while the runtime shuts down.
        .map_err(|_| StoreError::Closed)?
}

/// The client and shared attributes a device asks for, answered as ThingsBoard does:
/// `{"client":{…},"shared":{…}}`.
pub async fn read_for_device(store: &Store, device: DeviceId, req: AttributeRequest) -> Result<J, StoreError> {
    let mut sections = Vec::with_capacity(2);
    for (scope, keys) in req.reads() {
        let entries = read(store, device, Some(scope), keys).await?;
        sections.push((scope, entries.into_iter().map(|a| (a.key, a.value)).collect()));
    }
    Ok(device_response(sections))
}
