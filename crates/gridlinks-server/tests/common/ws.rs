//! A client of ThingsBoard's WebSocket API on a test server: tungstenite, a WebSocket
//! client written outside the project.

use std::net::TcpStream;
use std::time::Duration;

use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

use super::{Server, J};

pub type Ws = WebSocket<MaybeTlsStream<TcpStream>>;

/// A session on `s`'s `path` (e.g. `/api/ws`) whose reads give up after `read_timeout`.
pub fn open(s: &Server, path: &str, read_timeout: Duration) -> Ws {
    let url = format!("{}{path}", s.base.replacen("http://", "ws://", 1));
    let (ws, _) = tungstenite::connect(url).unwrap();
    if let MaybeTlsStream::Plain(t) = ws.get_ref() {
        t.set_read_timeout(Some(read_timeout)).unwrap();
    }
    ws
}

pub fn send(ws: &mut Ws, msg: J) {
    ws.send(Message::Text(msg.to_string().into())).unwrap();
}

/// The next JSON message (pings are answered by tungstenite itself).
pub fn next(ws: &mut Ws) -> J {
    loop {
        match ws.read().unwrap() {
            Message::Text(t) => return serde_json::from_str(&t).unwrap(),
            Message::Close(c) => panic!("the session closed: {c:?}"),
            _ => {}
        }
    }
}
