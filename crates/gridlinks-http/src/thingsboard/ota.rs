//! ThingsBoard's OTA package API: `POST /api/otaPackage` (the description),
//! `POST /api/otaPackage/{id}?checksumAlgorithm=&checksum=` (the file, `multipart/form-data`
//! part `file`), `GET /api/otaPackage/info/{id}`, `GET /api/otaPackage/{id}`,
//! `GET /api/otaPackage/{id}/download`, `GET /api/otaPackages`,
//! `GET /api/otaPackages/{deviceProfileId}/{type}`, `DELETE /api/otaPackage/{id}`; and the
//! HTTP device API's `GET /api/v1/{token}/firmware|software?title=&version=&size=&chunk=`.
//! The services are `gridlinks_platform::entities::ota`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gridlinks_platform::entities::ota::{self, OtaType, Upload};
use gridlinks_platform::{Core, Platform};
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::{model, multipart};
use gridlinks_types::ProfileId;
use serde::Deserialize;
use serde_json::Value as J;

use super::api::{parse_json, uuid};
use super::device_api::Device;
use super::error::{ApiError, ApiResult};
use super::extract::{Admin, Body, Q};
use super::paging::{doc_page, DocListParams};

/// Where uploads go: their body may be `ota.max_package_bytes` and its framing.
pub const UPLOAD_PREFIX: &str = "/api/otaPackage/";

/// Room for the multipart framing around an uploaded file.
pub const FRAMING_BYTES: usize = 64 * 1024;

/// ThingsBoard's `OtaPackageInfo` JSON of a package.
pub(crate) fn render(st: &Core, d: &DocRecord) -> J {
    let mut out = serde_json::Map::new();
    for f in ["deviceProfileId", "type", "title", "version", "tag", "url", "fileName", "contentType"] {
        out.insert(f.into(), d.doc.get(f).cloned().unwrap_or(J::Null));
    }
    for f in ["checksumAlgorithm", "checksum", "dataSize", "additionalInfo"] {
        out.insert(f.into(), d.doc.get(f).cloned().unwrap_or(J::Null));
    }
    out.insert("hasData".into(), d.doc["hasData"].as_bool().unwrap_or(false).into());
    out.insert("id".into(), model::entity_id("OTA_PACKAGE", d.id));
    out.insert("createdTime".into(), d.created_time.into());
    out.insert("tenantId".into(), model::entity_id("TENANT", st.doc_tenant(d)));
    out.insert("name".into(), d.doc.get("title").cloned().unwrap_or(J::Null));
    out.insert("externalId".into(), J::Null);
    J::Object(out)
}

/// `POST /api/otaPackage`: create, or update when the body has an id.
pub async fn save(Admin(me): Admin, State(st): State<Arc<Core>>, Body(body): Body) -> ApiResult<Json<J>> {
    let doc: J = parse_json(&body)?;
    let d = ota::save(&st, &me, doc).await?;
    Ok(Json(render(&st, &d)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct UploadParams {
    checksum_algorithm: Option<String>,
    checksum: Option<String>,
}

/// `POST /api/otaPackage/{id}?checksumAlgorithm=SHA256[&checksum=]`: the package's file,
/// as the form part `file` (or the raw body with any other content type); stored once.
pub async fn upload(
    Admin(me): Admin,
    State(st): State<Arc<Core>>,
    Path(id): Path<String>,
    Q(p): Q<UploadParams>,
    headers: HeaderMap,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let id = uuid(&id, "otaPackage")?;
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    let up = match multipart::boundary(content_type) {
        Ok(boundary) => {
            let part = multipart::part(&body, boundary, "file").map_err(|e| ApiError::bad_request(e.to_string()))?;
            let data = body.slice_ref(part.data);
            Upload {
                data,
                algorithm: p.checksum_algorithm,
                checksum: p.checksum,
                file_name: part.file_name,
                content_type: part.content_type,
            }
        }
        Err(_) => Upload {
            data: body,
            algorithm: p.checksum_algorithm,
            checksum: p.checksum,
            file_name: String::new(),
            content_type: if content_type.is_empty() { "application/octet-stream".into() } else { content_type.into() },
        },
    };
    let d = ota::upload(&st, &me, id, up).await?;
    Ok(Json(render(&st, &d)))
}

/// `GET /api/otaPackage/info/{id}` and `GET /api/otaPackage/{id}`: the description.
pub async fn info(Admin(me): Admin, State(st): State<Arc<Core>>, Path(id): Path<String>) -> ApiResult<Json<J>> {
    let d = ota::get(&st, &me, uuid(&id, "otaPackage")?).await?;
    Ok(Json(render(&st, &d)))
}

/// `GET /api/otaPackage/{id}/download`: the file.
pub async fn download(Admin(me): Admin, State(p): State<Arc<Platform>>, Path(id): Path<String>) -> ApiResult<Response> {
    let d = ota::get(&p.core, &me, uuid(&id, "otaPackage")?).await?;
    let data = ota::data(&p, d.id).await?.ok_or_else(|| ApiError::not_found("OtaPackage has no data"))?;
    Ok(file_response(&d, data))
}

fn file_response(d: &DocRecord, data: bytes::Bytes) -> Response {
    let name: String =
        d.doc["fileName"].as_str().unwrap_or("package.bin").chars().filter(|c| !c.is_control() && *c != '"').collect();
    let content_type = d.doc["contentType"].as_str().unwrap_or("application/octet-stream");
    let mut r = data.into_response();
    let h = r.headers_mut();
    for (k, v) in [
        (header::CONTENT_DISPOSITION.as_str(), format!("attachment;filename={name}")),
        ("x-filename", name.clone()),
        (header::CONTENT_TYPE.as_str(), content_type.to_owned()),
    ] {
        if let Ok(v) = v.parse() {
            h.insert(k, v);
        }
    }
    r
}

/// `GET /api/otaPackages?pageSize=&page=[&textSearch=&sortProperty=&sortOrder=]`.
pub async fn list(Admin(me): Admin, State(st): State<Arc<Core>>, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    let keep = ota::listed(&st, &me, None)?;
    Ok(Json(doc_page(&st, DocKind::OtaPackage, p, keep, |d| render(&st, d)).await?))
}

/// `GET /api/otaPackages/{deviceProfileId}/{type}?pageSize=&page=…`: the packages with
/// data of one profile and type (what can be assigned).
pub async fn list_for(
    Admin(me): Admin,
    State(st): State<Arc<Core>>,
    Path((profile, t)): Path<(String, String)>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    let profile = ProfileId(uuid(&profile, "deviceProfile")?);
    // Another tenant's profile does not exist for the caller.
    gridlinks_platform::entities::profiles::get(&st, &me, profile).await?;
    let t = OtaType::parse(&t).ok_or_else(|| ApiError::bad_request("type must be FIRMWARE or SOFTWARE"))?;
    let keep = ota::listed(&st, &me, Some((profile, t)))?;
    Ok(Json(doc_page(&st, DocKind::OtaPackage, p, keep, |d| render(&st, d)).await?))
}

/// `DELETE /api/otaPackage/{id}`: refused while a device or profile is assigned it.
pub async fn delete(Admin(me): Admin, State(p): State<Arc<Platform>>, Path(id): Path<String>) -> ApiResult<StatusCode> {
    ota::delete(&p, &me, uuid(&id, "otaPackage")?).await?;
    Ok(StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChunkParams {
    title: String,
    version: String,
    #[serde(default)]
    size: i64,
    #[serde(default)]
    chunk: i64,
}

async fn device_package(p: &Platform, device: Device, t: OtaType, q: ChunkParams) -> ApiResult<Response> {
    let device = super::device_api::metered(&p.core, device)?;
    let (Ok(size), Ok(chunk)) = (usize::try_from(q.size), usize::try_from(q.chunk)) else {
        return Err(ApiError::bad_request("size and chunk must not be negative"));
    };
    match ota::device_chunk(p, device, t, size, chunk).await? {
        None => Ok(StatusCode::NOT_FOUND.into_response()),
        // The device names what it expects; another package (reassigned meanwhile) is 400.
        Some((pkg, _)) if pkg.doc["title"] != q.title || pkg.doc["version"] != q.version => {
            Ok(StatusCode::BAD_REQUEST.into_response())
        }
        Some((pkg, bytes)) => Ok(file_response(&pkg, bytes)),
    }
}

/// `GET /api/v1/{token}/firmware?title=&version=[&size=&chunk=]`: chunk `chunk` of `size`
/// bytes (0: all) of the device's assigned firmware; 404 when none is assigned, 400 when
/// it is not the one named.
pub async fn device_firmware(
    State(p): State<Arc<Platform>>,
    device: Device,
    Q(q): Q<ChunkParams>,
) -> ApiResult<Response> {
    device_package(&p, device, OtaType::Firmware, q).await
}

/// `GET /api/v1/{token}/software?…`: the same for software.
pub async fn device_software(
    State(p): State<Arc<Platform>>,
    device: Device,
    Q(q): Q<ChunkParams>,
) -> ApiResult<Response> {
    device_package(&p, device, OtaType::Software, q).await
}
