//! `multipart/form-data` bodies (RFC 7578), as ThingsBoard's OTA upload takes its file: the
//! one part named `file`, with its file name and content type. Sans-IO: the whole body in,
//! a borrowed slice out.

/// One part of a form: its file name, content type and bytes.
#[derive(Debug, PartialEq, Eq)]
pub struct Part<'a> {
    /// `filename` of its `Content-Disposition` (empty when none).
    pub file_name: String,
    /// Its `Content-Type` (`application/octet-stream` when none).
    pub content_type: String,
    /// Its bytes.
    pub data: &'a [u8],
}

/// Why a body is not a form with the part asked for.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum MultipartError {
    /// The content type is not `multipart/form-data` with a boundary.
    #[error("expected Content-Type multipart/form-data with a boundary")]
    NotMultipart,
    /// The body does not follow the boundary's framing.
    #[error("malformed multipart body")]
    Malformed,
    /// No part has this name.
    #[error("no part named {0:?} in the form")]
    Missing(String),
}

/// The boundary of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Result<&str, MultipartError> {
    let (mime, params) = content_type.split_once(';').ok_or(MultipartError::NotMultipart)?;
    if !mime.trim().eq_ignore_ascii_case("multipart/form-data") {
        return Err(MultipartError::NotMultipart);
    }
    params
        .split(';')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("boundary"))
        .map(|(_, v)| v.trim().trim_matches('"'))
        .filter(|b| !b.is_empty() && b.len() <= 70)
        .ok_or(MultipartError::NotMultipart)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The value of `key="…"` in a header's parameters.
fn param(header: &str, key: &str) -> Option<String> {
    header
        .split(';')
        .filter_map(|p| p.split_once('='))
        .find_map(|(k, v)| k.trim().eq_ignore_ascii_case(key).then(|| v.trim().trim_matches('"').to_owned()))
}

/// The part named `name` of a form with `boundary`.
pub fn part<'a>(body: &'a [u8], boundary: &str, name: &str) -> Result<Part<'a>, MultipartError> {
    let delimiter = format!("--{boundary}");
    let mut rest = &body[find(body, delimiter.as_bytes()).ok_or(MultipartError::Malformed)? + delimiter.len()..];
    let next = format!("\r\n--{boundary}");
    loop {
        if rest.starts_with(b"--") {
            return Err(MultipartError::Missing(name.to_owned()));
        }
        rest = rest.strip_prefix(b"\r\n").ok_or(MultipartError::Malformed)?;
        let head_end = find(rest, b"\r\n\r\n").ok_or(MultipartError::Malformed)?;
        let head = std::str::from_utf8(&rest[..head_end]).map_err(|_| MultipartError::Malformed)?;
        let content = &rest[head_end + 4..];
        let end = find(content, next.as_bytes()).ok_or(MultipartError::Malformed)?;
        let (mut disposition, mut content_type) = (None, None);
        for line in head.split("\r\n") {
            let (k, v) = line.split_once(':').ok_or(MultipartError::Malformed)?;
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                disposition = Some(v.to_owned());
            } else if k.trim().eq_ignore_ascii_case("content-type") {
                content_type = Some(v.trim().to_owned());
            }
        }
        let disposition = disposition.ok_or(MultipartError::Malformed)?;
        if param(&disposition, "name").as_deref() == Some(name) {
            return Ok(Part {
                file_name: param(&disposition, "filename").unwrap_or_default(),
                content_type: content_type.unwrap_or_else(|| "application/octet-stream".into()),
                data: &content[..end],
            });
        }
        rest = &content[end + next.len()..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nignored\r\n--XyZ\r\n\
Content-Disposition: form-data; name=\"file\"; filename=\"fw.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n\
\x00\x01\r\n\x02\r\n--XyZ--\r\n";

    #[test]
    fn the_named_part_with_its_file_name() {
        assert_eq!(boundary("multipart/form-data; boundary=XyZ"), Ok("XyZ"));
        assert_eq!(boundary("multipart/form-data; boundary=\"XyZ\""), Ok("XyZ"));
        assert_eq!(boundary("application/json"), Err(MultipartError::NotMultipart));
        let p = part(BODY, "XyZ", "file").unwrap();
        assert_eq!(p.file_name, "fw.bin");
        assert_eq!(p.content_type, "application/octet-stream");
        assert_eq!(p.data, b"\x00\x01\r\n\x02");
        assert_eq!(part(BODY, "XyZ", "nope"), Err(MultipartError::Missing("nope".into())));
    }

    #[test]
    fn broken_framing_is_an_error_at_every_cut() {
        for cut in 0..BODY.len() - 4 {
            assert!(part(&BODY[..cut], "XyZ", "file").is_err(), "cut at {cut}");
        }
        assert!(part(b"--XyZ\r\nno colon\r\n\r\nx\r\n--XyZ--", "XyZ", "file").is_err());
    }
}
