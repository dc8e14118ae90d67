//! What the server checks of a datagram before it serves it, sans-IO: the message format
//! (RFC 7252 §3, which coap-lite's parser is more lenient about: [`screen`]) and the options
//! of a request ([`check_options`]: critical options the server does not implement, the
//! Content-Format of a body, the Accept of an answer).

use coap_lite::{CoapOption, MessageClass, Packet, RequestType};

/// Content-Format `text/plain; charset=utf-8` (RFC 7252 §12.3): taken for JSON bodies,
/// since some clients label their JSON text so.
pub const TEXT_PLAIN: u16 = 0;
/// Content-Format `application/json`.
pub const JSON: u16 = 50;
/// The Echo option (RFC 9175 §2.2.1): elective, safe to forward, 1–40 bytes.
pub const ECHO: u16 = 252;

/// Critical options (odd numbers) the server acts on in a request: Uri-Host (3), Uri-Port
/// (7), Uri-Path (11), Uri-Query (15), Accept (17), Block2 (23), Block1 (27). Any other
/// odd option number is unrecognized: 4.02 Bad Option (RFC 7252 §5.4.1). Elective options
/// (even numbers: ETag, Observe, Content-Format, Size1, Echo, …) are read or ignored.
const RECOGNIZED_CRITICAL: [u16; 7] = [3, 7, 11, 15, 17, 23, 27];
/// Proxy-Uri (35) and Proxy-Scheme (39): this server is no proxy (5.05, RFC 7252 §5.7.2).
const PROXY: [u16; 2] = [35, 39];

/// Why a datagram is not a CoAP message the server reads (RFC 7252 §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// Shorter than the 4-byte header.
    #[error("shorter than a CoAP header")]
    Short,
    /// A version other than 1: silently ignored (§3), never answered.
    #[error("CoAP version {0} (only 1 is known)")]
    Version(u8),
    /// Token length 9–15 (reserved), or a token cut short.
    #[error("token length {0} (at most 8, within the datagram)")]
    Token(u8),
    /// An Empty message (code 0.00) with a token or bytes after its header (§4.1).
    #[error("an Empty message with bytes after its header")]
    EmptyNotEmpty,
    /// Option delta or length nibble 15 outside a payload marker (§3.1), or an option
    /// number past 65,535.
    #[error("a reserved option delta or length")]
    ReservedOption,
    /// An option value running past the end of the datagram.
    #[error("an option runs past the end of the datagram")]
    OptionTruncated,
    /// A payload marker followed by a zero-length payload (§3).
    #[error("a payload marker with no payload after it")]
    EmptyPayload,
}

impl FormatError {
    /// Whether a confirmable message with this error is rejected with a Reset (§4.2):
    /// every format error of a version-1 message of at least a header. An unknown version
    /// and a datagram shorter than a header are ignored without an answer.
    pub fn resettable(self) -> bool {
        !matches!(self, FormatError::Short | FormatError::Version(_))
    }
}

/// Checks the message format of `datagram` where coap-lite is lenient: the version, the
/// token length, an Empty message's length, option deltas and lengths, and a payload marker
/// with nothing after it. A datagram that passes also parses with `Packet::from_bytes`.
pub fn screen(datagram: &[u8]) -> Result<(), FormatError> {
    let [first, code, _, _, rest @ ..] = datagram else { return Err(FormatError::Short) };
    let version = first >> 6;
    if version != 1 {
        return Err(FormatError::Version(version));
    }
    let tkl = first & 0x0f;
    if tkl > 8 || usize::from(tkl) > rest.len() {
        return Err(FormatError::Token(tkl));
    }
    if *code == 0 {
        return if rest.is_empty() { Ok(()) } else { Err(FormatError::EmptyNotEmpty) };
    }
    let mut at = usize::from(tkl);
    let mut number = 0u32;
    while let Some(&byte) = rest.get(at) {
        at += 1;
        if byte == 0xff {
            return if at < rest.len() { Ok(()) } else { Err(FormatError::EmptyPayload) };
        }
        let delta = extended(byte >> 4, rest, &mut at)?;
        let len = extended(byte & 0x0f, rest, &mut at)?;
        number += delta;
        if number > u32::from(u16::MAX) {
            return Err(FormatError::ReservedOption);
        }
        at = at.checked_add(len as usize).filter(|end| *end <= rest.len()).ok_or(FormatError::OptionTruncated)?;
    }
    Ok(())
}

/// An option delta or length nibble with its extension bytes (RFC 7252 §3.1).
fn extended(nibble: u8, rest: &[u8], at: &mut usize) -> Result<u32, FormatError> {
    let take = |n: usize, at: &mut usize| -> Result<u32, FormatError> {
        let bytes = rest.get(*at..*at + n).ok_or(FormatError::OptionTruncated)?;
        *at += n;
        Ok(bytes.iter().fold(0u32, |v, b| v << 8 | u32::from(*b)))
    };
    match nibble {
        13 => Ok(take(1, at)? + 13),
        14 => Ok(take(2, at)? + 269),
        15 => Err(FormatError::ReservedOption),
        n => Ok(u32::from(n)),
    }
}

/// Why a request's options keep it from being served.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// A critical option the server does not implement: 4.02 Bad Option for a confirmable
    /// request; a non-confirmable one is rejected (RFC 7252 §5.4.1).
    #[error("critical option {0} is not supported")]
    Unrecognized(u16),
    /// Proxy-Uri or Proxy-Scheme: 5.05 Proxying Not Supported.
    #[error("this server is not a proxy (option {0})")]
    Proxy(u16),
    /// A body in a Content-Format other than JSON: 4.15 Unsupported Content-Format.
    #[error("Content-Format {0} is not supported: send JSON (50)")]
    ContentFormat(u32),
    /// An Accept other than JSON on a GET: 4.06 Not Acceptable.
    #[error("Accept {0}: answers are JSON (50)")]
    Accept(u32),
}

impl OptionError {
    /// Whether a non-confirmable request with this error is rejected rather than answered:
    /// only an unrecognized critical option makes the message itself unacceptable.
    pub fn rejects_message(self) -> bool {
        matches!(self, OptionError::Unrecognized(_) | OptionError::Proxy(_))
    }
}

/// Checks a request's options: every critical option is one the server implements; a
/// request other than GET whose Content-Format is given names JSON (or plain text); a GET's
/// Accept, if given, is JSON.
pub fn check_options(packet: &Packet) -> Result<(), OptionError> {
    for (&number, _) in packet.options() {
        if number % 2 == 1 && !RECOGNIZED_CRITICAL.contains(&number) {
            return Err(if PROXY.contains(&number) {
                OptionError::Proxy(number)
            } else {
                OptionError::Unrecognized(number)
            });
        }
    }
    let get = packet.header.code == MessageClass::Request(RequestType::Get);
    if !get {
        if let Some(format) = uint_option(packet, CoapOption::ContentFormat) {
            if format != u32::from(JSON) && format != u32::from(TEXT_PLAIN) {
                return Err(OptionError::ContentFormat(format));
            }
        }
    } else if let Some(accept) = uint_option(packet, CoapOption::Accept) {
        if accept != u32::from(JSON) {
            return Err(OptionError::Accept(accept));
        }
    }
    Ok(())
}

/// The first value of a uint option (RFC 7252 §3.2); a value longer than 4 bytes reads as
/// `u32::MAX` (no such format exists).
fn uint_option(packet: &Packet, option: CoapOption) -> Option<u32> {
    let v = packet.get_first_option(option)?;
    Some(if v.len() > 4 { u32::MAX } else { v.iter().fold(0u32, |n, b| n << 8 | u32::from(*b)) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use coap_lite::MessageType;

    /// A confirmable POST to /t with `options` (number, value) and `payload` (none if empty).
    fn post(options: &[(u16, &[u8])], payload: &[u8]) -> Vec<u8> {
        let mut p = Packet::new();
        p.header.set_version(1);
        p.header.set_type(MessageType::Confirmable);
        p.header.code = MessageClass::Request(RequestType::Post);
        p.header.message_id = 7;
        p.add_option(CoapOption::UriPath, b"t".to_vec());
        for (n, v) in options {
            p.add_option(CoapOption::from(*n), v.to_vec());
        }
        p.payload = payload.to_vec();
        p.to_bytes().unwrap()
    }

    #[test]
    fn well_formed_messages_pass_and_parse() {
        for d in [post(&[], b"{}"), post(&[], b""), post(&[(12, &[50]), (2000, b"x")], b"{}"), vec![0x40, 0, 0, 1]] {
            assert_eq!(screen(&d), Ok(()), "{d:x?}");
            assert!(Packet::from_bytes(&d).is_ok());
        }
    }

    #[test]
    fn format_errors() {
        assert_eq!(screen(&[0x40, 0x01]), Err(FormatError::Short));
        // Version 0 and 2, otherwise well formed.
        let mut d = post(&[], b"{}");
        d[0] &= 0x3f;
        assert_eq!(screen(&d), Err(FormatError::Version(0)));
        d[0] |= 0x80;
        assert_eq!(screen(&d), Err(FormatError::Version(2)));
        assert!(!FormatError::Version(0).resettable());
        // A payload marker and nothing after it.
        let mut d = post(&[], b"");
        d.push(0xff);
        assert_eq!(screen(&d), Err(FormatError::EmptyPayload));
        assert!(FormatError::EmptyPayload.resettable());
        // An option value whose last byte is 0xff is no payload marker.
        assert_eq!(screen(&post(&[(4, &[0xff])], b"")), Ok(()));
        assert_eq!(screen(&[0x49, 0x02, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8, 9]), Err(FormatError::Token(9)));
        assert_eq!(screen(&[0x42, 0x02, 0, 7, 1]), Err(FormatError::Token(2)));
        assert_eq!(screen(&[0x41, 0x00, 0, 7, 1]), Err(FormatError::EmptyNotEmpty));
        assert_eq!(screen(&[0x40, 0x00, 0, 7, 0xff]), Err(FormatError::EmptyNotEmpty));
        assert_eq!(screen(&[0x40, 0x01, 0, 7, 0xf1, 0]), Err(FormatError::ReservedOption));
        assert_eq!(screen(&[0x40, 0x01, 0, 7, 0x1f]), Err(FormatError::ReservedOption));
        assert_eq!(screen(&[0x40, 0x01, 0, 7, 0x13, b'a']), Err(FormatError::OptionTruncated));
        assert_eq!(screen(&[0x40, 0x01, 0, 7, 0xd1]), Err(FormatError::OptionTruncated));
        // 65,804 + 1 is past the largest option number.
        assert_eq!(screen(&[0x40, 0x01, 0, 7, 0xe0, 0xff, 0xff, 0x10]), Err(FormatError::ReservedOption));
    }

    fn options_of(d: &[u8]) -> Result<(), OptionError> {
        check_options(&Packet::from_bytes(d).unwrap())
    }

    #[test]
    fn critical_options_content_formats_and_accept() {
        assert_eq!(options_of(&post(&[(9, b"")], b"{}")), Err(OptionError::Unrecognized(9)));
        assert!(OptionError::Unrecognized(9).rejects_message());
        assert_eq!(options_of(&post(&[(1, b"x")], b"{}")), Err(OptionError::Unrecognized(1)));
        assert_eq!(options_of(&post(&[(35, b"coap://x")], b"{}")), Err(OptionError::Proxy(35)));
        assert_eq!(options_of(&post(&[(2049, b"")], b"{}")), Err(OptionError::Unrecognized(2049)));
        // Elective options are ignored, known critical ones taken.
        assert_eq!(
            options_of(&post(&[(2048, b""), (4, b"e"), (ECHO, b"abc"), (3, b"host"), (27, &[8])], b"{}")),
            Ok(())
        );
        assert_eq!(options_of(&post(&[(12, &[])], b"{}")), Ok(()));
        assert_eq!(options_of(&post(&[(12, &[50])], b"{}")), Ok(()));
        assert_eq!(options_of(&post(&[(12, &[60])], b"\xa1")), Err(OptionError::ContentFormat(60)));
        assert!(!OptionError::ContentFormat(60).rejects_message());
        assert_eq!(options_of(&post(&[(12, &[0x2a, 0xf8])], b"{}")), Err(OptionError::ContentFormat(11000)));
        assert_eq!(options_of(&post(&[(12, &[0, 0, 0, 0, 50])], b"{}")), Err(OptionError::ContentFormat(u32::MAX)));
        let mut get = Packet::from_bytes(&post(&[(17, &[50])], b"")).unwrap();
        get.header.code = MessageClass::Request(RequestType::Get);
        assert_eq!(check_options(&get), Ok(()));
        get.set_content_format(coap_lite::ContentFormat::ApplicationCBOR);
        assert_eq!(check_options(&get), Ok(()), "a GET carries no body to read");
        get.clear_option(CoapOption::Accept);
        get.add_option(CoapOption::Accept, vec![60]);
        assert_eq!(check_options(&get), Err(OptionError::Accept(60)));
    }
}
