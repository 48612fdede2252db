//! A TCP proxy a test owns between its processes and a real server: it can start forwarding
//! late (a broker that is not up yet), drop every connection it carries (a broker restart) or
//! go silent (a network cut: connections stay open and nothing gets through), without touching
//! the server other tests share.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A port that forwards to `target` once [`Proxy::start`] is called.
pub struct Proxy {
    pub port: u16,
    target: String,
    carried: Arc<Mutex<Vec<TcpStream>>>,
    refusing: Arc<AtomicBool>,
    silent: Arc<AtomicBool>,
    listener: Option<TcpListener>,
}

impl Proxy {
    /// Reserve a free local port (nothing answers on it until [`Proxy::start`]).
    pub fn new(target: &str) -> Proxy {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free local port")
            .port();
        Proxy {
            port,
            target: target.to_owned(),
            carried: Arc::default(),
            refusing: Arc::default(),
            silent: Arc::default(),
            listener: None,
        }
    }

    /// Start accepting on the port and forwarding to the target.
    pub fn start(&mut self) {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).expect("bind the proxy port");
        let accepting = listener.try_clone().expect("clone the listener");
        let (target, carried) = (self.target.clone(), Arc::clone(&self.carried));
        let refusing = Arc::clone(&self.refusing);
        let silent = Arc::clone(&self.silent);
        std::thread::spawn(move || {
            for client in accepting.incoming() {
                let Ok(client) = client else { return };
                if refusing.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                for stream in [&client, &server] {
                    if let (Ok(stream), Ok(mut list)) = (stream.try_clone(), carried.lock()) {
                        list.push(stream);
                    }
                }
                pipe(&client, &server, &silent);
                pipe(&server, &client, &silent);
            }
        });
        self.listener = Some(listener);
    }

    /// An outage: every connection closed, and new ones closed at once, until [`Proxy::resume`].
    pub fn refuse(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        self.drop_connections();
    }

    /// A network cut: every connection stays open, and whatever either side sends is lost,
    /// until [`Proxy::resume`]. Nobody is told: no reset, no close.
    pub fn go_silent(&self) {
        self.silent.store(true, Ordering::SeqCst);
    }

    /// The end of an outage (or of a silence: what was lost stays lost).
    pub fn resume(&self) {
        self.refusing.store(false, Ordering::SeqCst);
        self.silent.store(false, Ordering::SeqCst);
    }

    /// The URL of `url` (an AMQP URL) with this proxy's address.
    pub fn url_for(&self, url: &str) -> String {
        let mut url = url::Url::parse(url).expect("a broker URL");
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(self.port)).expect("port");
        url.to_string()
    }

    /// Close every connection carried so far, from both sides.
    pub fn drop_connections(&self) {
        if let Ok(mut list) = self.carried.lock() {
            for stream in list.drain(..) {
                let _ = stream.shutdown(Shutdown::Both);
            }
        }
    }
}

fn pipe(from: &TcpStream, to: &TcpStream, silent: &Arc<AtomicBool>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else { return };
    let silent = Arc::clone(silent);
    std::thread::spawn(move || {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            let read = match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            // Silent: read and dropped, as a cut network drops packets.
            if !silent.load(Ordering::SeqCst) && to.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        // One side gone (a killed process, a dropped connection): the other side sees the
        // connection close, as it would without the proxy.
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.drop_connections();
    }
}
