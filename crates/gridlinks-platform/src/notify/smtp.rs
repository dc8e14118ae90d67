//! Sending one e-mail through an SMTP server (RFC 5321): `EHLO`, `STARTTLS` or implicit
//! TLS, `AUTH PLAIN`, `MAIL FROM`, `RCPT TO`, `DATA`, `QUIT`. The reply parser and the
//! message builder are sans-IO ([`parse_reply`], [`message`]); [`send`] drives them over
//! tokio, every exchange bounded by the configured timeout.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::SmtpConfig;

/// Longest reply line read (RFC 5321 allows 512 octets).
const MAX_LINE: usize = 2048;
/// Most lines in one reply.
const MAX_LINES: usize = 100;

/// Why an e-mail was not sent.
#[derive(Debug, thiserror::Error)]
pub enum SmtpError {
    /// The server answered with an error (its code and text).
    #[error("smtp server refused {step}: {code} {text}")]
    Refused {
        /// What was asked.
        step: &'static str,
        /// Its reply code.
        code: u16,
        /// Its reply text.
        text: String,
    },
    /// The server's reply is not SMTP.
    #[error("smtp server sent a malformed reply: {0}")]
    Malformed(String),
    /// The connection failed or timed out.
    #[error("smtp: {0}")]
    Io(String),
    /// The configuration or the message cannot be used.
    #[error("smtp: {0}")]
    Invalid(String),
}

/// One SMTP reply: its code and text lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The three-digit code.
    pub code: u16,
    /// The text of each line.
    pub lines: Vec<String>,
}

/// Reads one complete reply from the start of `buf`: the reply and the bytes it took, or
/// `None` when more bytes are needed.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply, usize)>, SmtpError> {
    let mut at = 0;
    let mut lines = Vec::new();
    loop {
        let Some(end) = buf[at..].iter().position(|b| *b == b'\n') else {
            if buf.len() - at > MAX_LINE {
                return Err(SmtpError::Malformed("a reply line is too long".into()));
            }
            return Ok(None);
        };
        let line = &buf[at..at + end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > MAX_LINE || line.len() < 3 {
            return Err(SmtpError::Malformed(format!("reply line of {} bytes", line.len())));
        }
        let code = std::str::from_utf8(&line[..3])
            .ok()
            .filter(|c| c.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| SmtpError::Malformed("a reply without a code".into()))?;
        let more = line.get(3) == Some(&b'-');
        if line.len() > 3 && !more && line[3] != b' ' {
            return Err(SmtpError::Malformed("a reply code not followed by a space or '-'".into()));
        }
        let text = String::from_utf8_lossy(line.get(4..).unwrap_or_default()).into_owned();
        if lines.len() >= MAX_LINES {
            return Err(SmtpError::Malformed("a reply of too many lines".into()));
        }
        lines.push((code, text));
        at += end + 1;
        if !more {
            let code = lines[0].0;
            if lines.iter().any(|(c, _)| *c != code) {
                return Err(SmtpError::Malformed("a reply whose lines have different codes".into()));
            }
            return Ok(Some((Reply { code, lines: lines.into_iter().map(|(_, t)| t).collect() }, at)));
        }
    }
}

/// Whether a header value is safe (no line breaks: no header injection).
fn header_safe(s: &str) -> bool {
    !s.contains(['\r', '\n'])
}

/// A header value, encoded (RFC 2047) when it is not plain ASCII.
fn encoded_word(s: &str) -> String {
    if s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        s.to_owned()
    } else {
        format!("=?UTF-8?B?{}?=", base64::engine::general_purpose::STANDARD.encode(s))
    }
}

/// The message as sent after `DATA`, with the terminating `.` line: a plain-text UTF-8
/// body in base64 (so no line of it starts with a dot or is too long).
pub fn message(from: &str, to: &str, subject: &str, body: &str, date: &str, id: &str) -> Result<Vec<u8>, SmtpError> {
    for (what, v) in [("from", from), ("to", to), ("subject", subject)] {
        if !header_safe(v) {
            return Err(SmtpError::Invalid(format!("the {what} has a line break")));
        }
    }
    let mut m = format!(
        "From: {from}\r\nTo: {to}\r\nSubject: {}\r\nDate: {date}\r\nMessage-ID: <{id}@gridlinks>\r\nMIME-Version: 1.0\r\n\
         Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\n",
        encoded_word(subject)
    );
    let b64 = base64::engine::general_purpose::STANDARD.encode(body);
    for chunk in b64.as_bytes().chunks(76) {
        m.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        m.push_str("\r\n");
    }
    m.push_str(".\r\n");
    Ok(m.into_bytes())
}

/// An address as `MAIL FROM`/`RCPT TO` take it: no brackets, spaces or line breaks.
fn address(a: &str) -> Result<&str, SmtpError> {
    let ok = a.contains('@') && !a.is_empty() && !a.contains(['<', '>', ' ', '\r', '\n']) && a.len() <= 254;
    ok.then_some(a).ok_or_else(|| SmtpError::Invalid(format!("{a:?} is not an e-mail address")))
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

struct Session {
    io: Box<dyn Io>,
    buf: Vec<u8>,
    timeout: Duration,
}

impl Session {
    async fn reply(&mut self, step: &'static str, ok: &[u16]) -> Result<Reply, SmtpError> {
        let read = async {
            loop {
                if let Some((r, used)) = parse_reply(&self.buf)? {
                    self.buf.drain(..used);
                    return Ok(r);
                }
                let mut chunk = [0u8; 1024];
                let n = self.io.read(&mut chunk).await.map_err(|e| SmtpError::Io(e.to_string()))?;
                if n == 0 {
                    return Err(SmtpError::Io(format!("the server closed the connection at {step}")));
                }
                self.buf.extend_from_slice(&chunk[..n]);
            }
        };
        let r = tokio::time::timeout(self.timeout, read)
            .await
            .map_err(|_| SmtpError::Io(format!("no reply to {step} within the timeout")))??;
        if ok.contains(&r.code) {
            Ok(r)
        } else {
            Err(SmtpError::Refused { step, code: r.code, text: r.lines.join(" ") })
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<(), SmtpError> {
        tokio::time::timeout(self.timeout, self.io.write_all(bytes))
            .await
            .map_err(|_| SmtpError::Io("sending timed out".into()))?
            .map_err(|e| SmtpError::Io(e.to_string()))
    }

    async fn command(&mut self, line: &str, step: &'static str, ok: &[u16]) -> Result<Reply, SmtpError> {
        self.send(format!("{line}\r\n").as_bytes()).await?;
        self.reply(step, ok).await
    }
}

fn tls_connector() -> tokio_rustls::TlsConnector {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map(|b| b.with_root_certificates(roots).with_no_client_auth());
    // The ring provider supports the default versions; a failure here is a build defect.
    tokio_rustls::TlsConnector::from(Arc::new(config.unwrap_or_else(|_| {
        rustls::ClientConfig::builder().with_root_certificates(rustls::RootCertStore::empty()).with_no_client_auth()
    })))
}

async fn tls(io: Box<dyn Io>, host: &str) -> Result<Box<dyn Io>, SmtpError> {
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|_| SmtpError::Invalid(format!("{host:?} is not a host name")))?;
    let stream = tls_connector().connect(name, io).await.map_err(|e| SmtpError::Io(format!("TLS: {e}")))?;
    Ok(Box::new(stream))
}

/// Sends one e-mail to `to` through the server `cfg` names (`password`: read from its
/// `password_file`).
pub async fn send(
    cfg: &SmtpConfig,
    password: Option<&str>,
    timeout: Duration,
    to: &str,
    subject: &str,
    body: &str,
) -> Result<(), SmtpError> {
    if cfg.host.is_empty() || cfg.from.is_empty() {
        return Err(SmtpError::Invalid("no SMTP server: set notifications.smtp.host and from".into()));
    }
    let (from, to) = (address(&cfg.from)?, address(to)?);
    let tcp = tokio::time::timeout(timeout, TcpStream::connect((cfg.host.as_str(), cfg.port)))
        .await
        .map_err(|_| SmtpError::Io(format!("connecting to {}:{} timed out", cfg.host, cfg.port)))?
        .map_err(|e| SmtpError::Io(format!("connecting to {}:{}: {e}", cfg.host, cfg.port)))?;
    let io: Box<dyn Io> = match cfg.security.as_str() {
        "tls" => tls(Box::new(tcp), &cfg.host).await?,
        "starttls" | "none" => Box::new(tcp),
        other => return Err(SmtpError::Invalid(format!("security {other:?}: starttls, tls or none"))),
    };
    let mut s = Session { io, buf: Vec::new(), timeout };
    s.reply("the greeting", &[220]).await?;
    s.command("EHLO gridlinks", "EHLO", &[250]).await?;
    if cfg.security == "starttls" {
        s.command("STARTTLS", "STARTTLS", &[220]).await?;
        if !s.buf.is_empty() {
            return Err(SmtpError::Malformed("data after the STARTTLS reply".into()));
        }
        s.io = tls(s.io, &cfg.host).await?;
        s.command("EHLO gridlinks", "EHLO", &[250]).await?;
    }
    if !cfg.username.is_empty() {
        let secret = format!("\0{}\0{}", cfg.username, password.unwrap_or_default());
        let auth = format!("AUTH PLAIN {}", base64::engine::general_purpose::STANDARD.encode(secret));
        s.command(&auth, "AUTH", &[235]).await?;
    }
    s.command(&format!("MAIL FROM:<{from}>"), "MAIL FROM", &[250]).await?;
    s.command(&format!("RCPT TO:<{to}>"), "RCPT TO", &[250, 251]).await?;
    s.command("DATA", "DATA", &[354]).await?;
    let now = jiff::Timestamp::now();
    let date = now.strftime("%a, %d %b %Y %H:%M:%S +0000").to_string();
    s.send(&message(from, to, subject, body, &date, &uuid::Uuid::new_v4().to_string())?).await?;
    s.reply("the message", &[250]).await?;
    // The message is accepted: a failed QUIT changes nothing.
    let _ = s.command("QUIT", "QUIT", &[221]).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_read_whole_and_only_whole() {
        assert_eq!(parse_reply(b"250-smtp.example\r\n250-SIZE 1000").unwrap(), None);
        let (r, n) = parse_reply(b"250-smtp.example\r\n250 STARTTLS\r\n354 go").unwrap().unwrap();
        assert_eq!((r.code, r.lines.clone(), n), (250, vec!["smtp.example".to_owned(), "STARTTLS".to_owned()], 32));
        assert_eq!(parse_reply(b"220\r\n").unwrap().unwrap().0.code, 220);
        for bad in [&b"25\r\n"[..], b"abc hello\r\n", b"250-a\r\n251 b\r\n", b"250xhello\r\n"] {
            assert!(parse_reply(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
        assert!(parse_reply(&vec![b'2'; MAX_LINE + 10]).is_err(), "an endless line");
    }

    #[test]
    fn messages_cannot_inject_headers_and_bodies_cannot_end_the_data() {
        let m = message("a@x.org", "b@y.org", "Überhitzung", ".\r\nQUIT\r\n", "Sat, 28 Nov 2026 00:00:00 +0000", "1")
            .unwrap();
        let text = String::from_utf8(m).unwrap();
        assert!(text.contains("Subject: =?UTF-8?B?"), "{text}");
        assert!(text.ends_with("\r\n.\r\n"));
        assert_eq!(text.matches("\r\n.\r\n").count(), 1, "only the terminator is a lone dot: {text}");
        assert!(message("a@x.org", "b@y.org\r\nBcc: c@z.org", "s", "b", "d", "1").is_err());
        assert!(address("<evil>@x").is_err() && address("no-at").is_err());
    }
}
