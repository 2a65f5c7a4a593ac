//! Load for a Redis-protocol server on 127.0.0.1, shared by the mini-redis test
//! (`tests/mini_redis.rs`) and benchmark (`benches/mini_redis.rs`): the server child's
//! listening socket, how the parent learns its address, and a plain RESP client.
//!
//! The client sends one command at a time on a connection, each after the last one's reply, as
//! a service's callers wait for their answers. It does not pipeline: a try with 16 commands a
//! batch stalled about 11 ms on every batch (mini-redis writes each reply as it is ready, on a
//! socket without `TCP_NODELAY`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

/// The server child's side: a multi-thread runtime of `workers` workers and a listener on a
/// free port of 127.0.0.1, whose address it prints as `listening ADDR` for [`server_addr`].
pub fn listen(workers: usize) -> (tokio::runtime::Runtime, tokio::net::TcpListener) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a port on 127.0.0.1");
    println!("listening {}", listener.local_addr().expect("its address"));
    (rt, listener)
}

/// The parent's side: reads the child's output up to its `listening ADDR` line (other lines,
/// such as a test harness's, are skipped) and returns the address.
///
/// # Panics
/// If the output ends first: the server did not start.
pub fn server_addr(out: &mut impl BufRead) -> SocketAddr {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap_or(0) > 0,
            "the server did not start"
        );
        if let Some(a) = line.trim().strip_prefix("listening ") {
            return a.parse().expect("an address after `listening`");
        }
    }
}

/// Appends a RESP array of bulk strings to `out`.
pub fn command(parts: &[&[u8]], out: &mut Vec<u8>) {
    let _ = write!(out, "*{}\r\n", parts.len());
    for p in parts {
        let _ = write!(out, "${}\r\n", p.len());
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
}

/// Sends `count` commands, made by `make(i, buf)` for `i` in `0..count`, one at a time on a new
/// connection, each after the last one's reply; returns how many replies were a value or OK
/// (not nil). Commands are made as they are sent, so that the client's memory stays small (a
/// child spawned from it would inherit its peak RSS).
///
/// # Panics
/// On a connection error or a reply that is not `+OK`, nil or a bulk string.
pub fn send_all(addr: SocketAddr, count: usize, make: impl Fn(usize, &mut Vec<u8>)) -> usize {
    let s = TcpStream::connect(addr).expect("connect to the server");
    s.set_nodelay(true).expect("TCP_NODELAY");
    let mut w = s.try_clone().expect("a second handle");
    let mut r = BufReader::new(s);
    let (mut cmd, mut line, mut body) = (Vec::new(), String::new(), Vec::new());
    let mut ok = 0;
    for i in 0..count {
        cmd.clear();
        make(i, &mut cmd);
        w.write_all(&cmd).expect("send a command");
        line.clear();
        r.read_line(&mut line).expect("read a reply");
        match line.as_bytes().first() {
            Some(b'+') => ok += 1,
            Some(b'$') if line.starts_with("$-1") => {}
            Some(b'$') => {
                let n: usize = line[1..].trim().parse().expect("a bulk string's length");
                body.resize(n + 2, 0);
                r.read_exact(&mut body).expect("a bulk string");
                ok += 1;
            }
            _ => panic!("unexpected reply {line:?}"),
        }
    }
    ok
}
