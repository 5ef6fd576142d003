//! The ARP server on its local WebSocket (127.0.0.1:0) over the sim driver,
//! and an ARP client that validates every frame either way against the ARP
//! schema.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use signalling_protocol::arp_schema::ArpValidator;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use super::WAIT;
use crate::arp::ws::ArpListener;
use crate::arp::{ArpOptions, ArpServer, ListenConfig, Token};
use crate::controller::{self, ControllerHandle};
use crate::driver::sim::{self, SimConfig, SimProbe};
use crate::driver::DriverHandle;
use crate::safety::SafetyLimits;

/// The fixture's tokens, `ROLE:SECRET`.
pub const OPERATOR: &str = "operator:op-secret";
pub const OPERATOR2: &str = "operator:op2-secret";
pub const VIEWER: &str = "viewer:view-secret";

/// The ARP server the fixture runs; the listener stops when it drops.
pub struct Fixture {
    pub url: String,
    pub probe: SimProbe,
    pub controller: ControllerHandle,
    pub server: ArpServer,
    listener: tokio::task::JoinHandle<()>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The ARP server over the sim driver (ready), listening with the three
/// tokens above.
pub async fn fixture(options: ArpOptions) -> Fixture {
    let (handle, end) = DriverHandle::channel();
    let pose = handle.pose.clone();
    let probe = sim::spawn(end, SimConfig::default());
    let controller = controller::spawn(SafetyLimits::default(), handle);
    let deadline = Instant::now() + WAIT;
    while !controller.status().await.expect("status").driver_ready {
        assert!(Instant::now() < deadline, "sim never ready");
        tokio::task::yield_now().await;
    }
    let server = ArpServer::new(super::shared(controller.clone(), None), pose, options);
    let tokens: Vec<Token> = [OPERATOR, OPERATOR2, VIEWER]
        .iter()
        .map(|t| t.parse().expect("token"))
        .collect();
    let listen = ListenConfig::new("127.0.0.1:0", tokens).expect("listen");
    let listener = ArpListener::bind(&listen).await.expect("bind");
    let url = format!("ws://{}/arp", listener.local_addr().expect("addr"));
    let task = tokio::spawn(listener.run(server.clone()));
    Fixture {
        url,
        probe,
        controller,
        server,
        listener: task,
    }
}

/// The secret of a `ROLE:SECRET` token.
pub fn secret(token: &str) -> &str {
    token.split_once(':').expect("ROLE:SECRET").1
}

/// An ARP client: validates every frame, keeps notifications that arrive
/// while it waits for a response.
pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next: u64,
    methods: HashMap<String, String>,
    /// Notifications and answers read while waiting for another one.
    pub backlog: VecDeque<Value>,
}

fn id_key(id: &Value) -> String {
    match id {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl Client {
    pub async fn connect(url: &str, token: &str) -> Client {
        let url = format!("{url}?token={}", secret(token));
        let (ws, _) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(url))
            .await
            .expect("connect in time")
            .expect("connect");
        Client {
            ws,
            next: 1,
            methods: HashMap::new(),
            backlog: VecDeque::new(),
        }
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::text(text)).await.expect("send");
    }

    pub async fn send(&mut self, message: Value) {
        if let Err(e) = ArpValidator::shared().validate(&message, None) {
            panic!("the test sends an invalid ARP message: {e}\n{message}");
        }
        self.send_raw(&message.to_string()).await;
    }

    pub async fn request(&mut self, method: &str, params: Value) -> Value {
        let id = json!(format!("t{}", self.next));
        self.next += 1;
        self.methods.insert(id_key(&id), method.to_owned());
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// A request that breaks the schema on purpose; its answer is checked.
    pub async fn call_invalid(&mut self, method: &str, params: Value) -> Value {
        let id = json!(format!("t{}", self.next));
        self.next += 1;
        self.methods.insert(id_key(&id), method.to_owned());
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        assert!(ArpValidator::shared().validate(&message, None).is_err());
        self.send_raw(&message.to_string()).await;
        self.response(&id).await
    }

    /// The next frame from the robot, schema-checked.
    pub async fn read(&mut self) -> Value {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a frame in time")
                .expect("socket open")
                .expect("frame");
            let text = match message {
                Message::Text(t) => t.to_string(),
                Message::Close(c) => panic!("closed: {c:?}"),
                _ => continue,
            };
            let value: Value = serde_json::from_str(&text).expect("robot sends JSON");
            let answered = value
                .get("id")
                .filter(|_| value.get("method").is_none())
                .and_then(|id| self.methods.get(&id_key(id)).cloned());
            if let Err(e) = ArpValidator::shared().validate(&value, answered.as_deref()) {
                panic!("the robot sent an invalid ARP message: {e}\n{value}");
            }
            return value;
        }
    }

    /// The response to request `id`; anything else is kept.
    pub async fn response(&mut self, id: &Value) -> Value {
        if let Some(i) = self
            .backlog
            .iter()
            .position(|v| v.get("method").is_none() && &v["id"] == id)
        {
            return self.backlog.remove(i).expect("present");
        }
        loop {
            let v = self.read().await;
            if v.get("method").is_none() && &v["id"] == id {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    /// The next message with `method` (request or notification).
    pub async fn message(&mut self, method: &str) -> Value {
        if let Some(i) = self.backlog.iter().position(|v| v["method"] == method) {
            return self.backlog.remove(i).expect("present");
        }
        loop {
            let v = self.read().await;
            if v["method"] == method {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        self.response(&id).await
    }

    pub async fn result(&mut self, method: &str, params: Value) -> Value {
        let v = self.call(method, params).await;
        assert!(v.get("error").is_none(), "{method} failed: {v}");
        v["result"].clone()
    }

    pub async fn initialize(&mut self) -> Value {
        self.result(
            "arp.initialize",
            json!({"protocolVersion": "0.1.0", "clientInfo": {"name": "test", "version": "1"}, "capabilities": {"confirmation": true}}),
        )
        .await
    }

    pub async fn tool(&mut self, name: &str, arguments: Value) -> Value {
        self.call(
            "arp.callTool",
            json!({"name": name, "arguments": arguments}),
        )
        .await
    }
}

/// Waits (bounded) until the sim's state satisfies `f`.
pub async fn until(probe: &SimProbe, what: &str, f: impl Fn(&sim::SimState) -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f(&probe.state()) {
        assert!(
            Instant::now() < deadline,
            "never: {what} ({:?})",
            probe.state()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
