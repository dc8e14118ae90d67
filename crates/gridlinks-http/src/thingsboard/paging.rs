//! Pages of lists as ThingsBoard serves them: the page link (`pageSize`, `page`), the sort
//! order, `PageData`, and one list path for entities kept as documents (customers,
//! dashboards, API keys).

use gridlinks_storage::{DocKind, DocRecord};
use serde::Deserialize;
use serde_json::Value as J;

use super::api::blocking;
use super::error::{ApiError, ApiResult};
use gridlinks_platform::Core;
use gridlinks_thingsboard::model;

/// A page request's size and number, checked as ThingsBoard checks them (400 naming the
/// bound; the largest page is `http.max_page_size`).
pub(crate) fn page_link(st: &Core, page_size: i64, page: i64) -> ApiResult<(usize, usize)> {
    let max = st.cfg.http.max_page_size as i64;
    if page_size < 1 || page_size > max {
        return Err(ApiError::bad_request(format!(
            "Incorrect page link page size '{page_size}'. Page size must be between 1 and {max}."
        )));
    }
    if page < 0 {
        return Err(ApiError::bad_request(format!(
            "Incorrect page link page '{page}'. Page must be positive integer."
        )));
    }
    Ok((page_size as usize, page as usize))
}

/// Whether `sortOrder` asks for descending order (`ASC` when absent).
pub(crate) fn descending(order: Option<&str>) -> ApiResult<bool> {
    match order.map(str::to_ascii_uppercase).as_deref() {
        None | Some("ASC") => Ok(false),
        Some("DESC") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "Unsupported sort order '{other}'! Only 'ASC' or 'DESC' types are allowed."
        ))),
    }
}

/// Page `(size, number)` of `all`, each item rendered, as ThingsBoard's `PageData`.
pub(crate) fn page_of<T>(all: &[T], (size, page): (usize, usize), render: impl Fn(&T) -> J) -> J {
    let data = all.iter().skip(page.saturating_mul(size)).take(size).map(render).collect();
    model::page(data, all.len(), size, page)
}

/// The parameters of a list of documents.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DocListParams {
    page_size: i64,
    page: i64,
    text_search: Option<String>,
    sort_property: Option<String>,
    sort_order: Option<String>,
    /// Dashboards: leave out those hidden on mobile.
    mobile: Option<bool>,
}

/// A page of `kind`'s documents that `keep` accepts, each rendered: `textSearch` matches
/// the title (any case); sorted by title (`sortProperty` `title`, `name` or `description`)
/// or `createdTime`.
pub(crate) async fn doc_page(
    st: &Core,
    kind: DocKind,
    p: DocListParams,
    keep: impl Fn(&DocRecord) -> bool,
    render: impl Fn(&DocRecord) -> J,
) -> ApiResult<J> {
    let link = page_link(st, p.page_size, p.page)?;
    let desc = descending(p.sort_order.as_deref())?;
    let by_time = match p.sort_property.as_deref().unwrap_or("title") {
        "title" | "name" | "description" => false,
        "createdTime" => true,
        other => return Err(ApiError::bad_request(format!("Unsupported sort property: {other}"))),
    };
    let store = st.store.clone();
    // By title already.
    let mut all = blocking(move || store.docs(kind)).await?;
    let q = p.text_search.map(|q| q.to_lowercase()).filter(|q| !q.is_empty());
    let hidden = |d: &DocRecord| p.mobile == Some(true) && d.doc.get("mobileHide").and_then(J::as_bool) == Some(true);
    all.retain(|d| keep(d) && !hidden(d) && q.as_ref().is_none_or(|q| d.title.to_lowercase().contains(q)));
    if by_time {
        all.sort_by_key(|d| d.created_time);
    }
    if desc {
        all.reverse();
    }
    Ok(page_of(&all, link, render))
}
