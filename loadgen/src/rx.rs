//! Reads that say when their bytes arrived.
//!
//! A chunk's time is when the kernel received it, not when the load
//! generator got round to reading it. When a thousand streams deliver their
//! first token in the same millisecond, the last socket is read a while
//! after the first; timing each chunk at its read would add that queueing,
//! the load generator's own, to the server's latency. Sockets are asked for
//! receive timestamps (`SO_TIMESTAMPNS`) and each read reports how long its
//! newest bytes had waited in the socket.
//!
//! The kernel stamps with the wall clock, and the wall clock may be stepped
//! while a run goes on; only the wait (wall clock now minus the stamp, both
//! read within a microsecond of each other) is used, and callers keep every
//! time at or after the ones before it. Where there are no stamps (another
//! OS, a kernel that gives none) the wait is zero: the read's own time.

use std::io;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::TcpStream;

/// One read: how many bytes, and how long the newest of them had waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub waited: Duration,
}

/// Asks the kernel to stamp what `tcp` receives.
pub fn enable(tcp: &TcpStream) -> io::Result<()> {
    imp::enable(tcp)
}

/// Reads what `tcp` has into `buf` (0 bytes: the peer closed).
///
/// A read shorter than the buffer took all there was: the socket's
/// readiness is cleared then, so the next poll waits for new bytes without
/// another system call (as tokio's own `poll_read` does).
pub fn poll_recv(tcp: &TcpStream, buf: &mut [u8], cx: &mut Context<'_>) -> Poll<io::Result<Received>> {
    imp::poll_recv(tcp, buf, cx)
}

#[cfg(target_os = "linux")]
mod imp {
    use std::io;
    use std::io::IoSliceMut;
    use std::os::fd::AsRawFd;
    use std::task::{Context, Poll, ready};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg, setsockopt, sockopt};
    use tokio::io::Interest;
    use tokio::net::TcpStream;

    use super::Received;

    pub(super) fn enable(tcp: &TcpStream) -> io::Result<()> {
        setsockopt(tcp, sockopt::ReceiveTimestampns, &true).map_err(io::Error::from)
    }

    /// Room for one `SCM_TIMESTAMPNS` message (32 bytes on 64-bit Linux),
    /// aligned as a `cmsghdr` must be.
    #[repr(C, align(8))]
    struct Control([u8; 64]);

    pub(super) fn poll_recv(tcp: &TcpStream, buf: &mut [u8], cx: &mut Context<'_>) -> Poll<io::Result<Received>> {
        let capacity = buf.len();
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            // A short read is handed out through `short` while the closure
            // says "would block", which is what makes tokio clear readiness.
            let mut short = None;
            let result = tcp.try_io(Interest::READABLE, || {
                let got = recv(tcp, buf)?;
                if got.len > 0 && got.len < capacity {
                    short = Some(got);
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Ok(got)
            });
            match (result, short) {
                (_, Some(got)) => return Poll::Ready(Ok(got)),
                (Ok(got), None) => return Poll::Ready(Ok(got)),
                (Err(e), None) if e.kind() == io::ErrorKind::WouldBlock => continue,
                (Err(e), None) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn recv(tcp: &TcpStream, buf: &mut [u8]) -> io::Result<Received> {
        let mut control = Control([0; 64]);
        let mut iov = [IoSliceMut::new(buf)];
        let msg = recvmsg::<()>(tcp.as_raw_fd(), &mut iov, Some(&mut control.0[..]), MsgFlags::empty())?;
        let mut waited = Duration::ZERO;
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmTimestampns(stamp) = cmsg {
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                    let secs = u64::try_from(stamp.tv_sec()).unwrap_or(0);
                    let nanos = u32::try_from(stamp.tv_nsec()).unwrap_or(0);
                    // A stamp "in the future" (the clock was stepped back)
                    // says nothing: no wait.
                    waited = now.saturating_sub(Duration::new(secs, nanos));
                }
            }
        }
        Ok(Received { len: msg.bytes, waited })
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::io;
    use std::task::{Context, Poll, ready};
    use std::time::Duration;

    use tokio::net::TcpStream;

    use super::Received;

    pub(super) fn enable(_tcp: &TcpStream) -> io::Result<()> {
        Ok(())
    }

    pub(super) fn poll_recv(tcp: &TcpStream, buf: &mut [u8], cx: &mut Context<'_>) -> Poll<io::Result<Received>> {
        loop {
            ready!(tcp.poll_read_ready(cx))?;
            match tcp.try_read(buf) {
                Ok(len) => return Poll::Ready(Ok(Received { len, waited: Duration::ZERO })),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::future::poll_fn;
    use std::time::{Duration, Instant};

    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    #[tokio::test]
    async fn a_read_says_how_long_its_bytes_waited_in_the_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).await.expect("connect");
        enable(&client).expect("receive timestamps");
        let (mut server, _) = listener.accept().await.expect("accept");
        let mut buf = [0u8; 16];

        // The kernel turns stamping on a moment after the first socket asks
        // (from a work queue): until then reads carry no stamp.
        let mut stamped = false;
        for _ in 0..200 {
            server.write_all(b"warm").await.expect("write");
            std::thread::sleep(Duration::from_millis(5));
            let got = poll_fn(|cx| poll_recv(&client, &mut buf, cx)).await.expect("read");
            assert_eq!(&buf[..got.len], b"warm");
            if got.waited > Duration::ZERO {
                stamped = true;
                break;
            }
        }
        assert!(stamped, "no read in a second carried a receive timestamp");

        let writing = Instant::now();
        server.write_all(b"first").await.expect("write");
        // The bytes arrive while this thread does something else.
        std::thread::sleep(Duration::from_millis(100));
        let got = poll_fn(|cx| poll_recv(&client, &mut buf, cx)).await.expect("read");
        let since = writing.elapsed();
        assert_eq!(&buf[..got.len], b"first");
        // The wall clock, which stamps, may be slewed against the monotonic
        // one by up to 0.05%: a millisecond either way is plenty.
        let slack = Duration::from_millis(1);
        assert!(got.waited + slack >= Duration::from_millis(100), "{got:?}");
        assert!(got.waited <= since + slack, "{got:?} waited longer than the {since:?} since the write");

        // Read at once: (nearly) no wait. The short read cleared readiness,
        // and the next read waits for the new bytes rather than failing.
        server.write_all(b"second").await.expect("write");
        let got = poll_fn(|cx| poll_recv(&client, &mut buf, cx)).await.expect("read");
        assert_eq!(&buf[..got.len], b"second");
        assert!(got.waited < Duration::from_millis(100), "{got:?}");

        drop(server);
        let got = poll_fn(|cx| poll_recv(&client, &mut buf, cx)).await.expect("read");
        assert_eq!(got.len, 0, "the peer's close reads as nothing");
    }
}
