//! Step 9: the network namespace's only interface, `lo`, brought up.
//! Needs CAP_NET_ADMIN in the namespace, so it runs before the drop.

use super::{SetupError, StepResult};

const STEP: &str = "net";

/// Bring `lo` up.
/// IFF_UP | IFF_RUNNING (0x41): fits the c_short of `ifru_flags`.
#[allow(clippy::cast_possible_truncation)]
const UP_RUNNING: libc::c_short = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;

pub fn loopback_up() -> StepResult {
    // SAFETY: creates a socket; the fd is closed below on every path.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(SetupError::last_os(STEP, "socket for interface control"));
    }
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into the valid `ifr` we own.
    let mut ret = unsafe { libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut ifr) };
    if ret == 0 {
        // SAFETY: the union's flags member was just filled by the kernel.
        unsafe {
            ifr.ifr_ifru.ifru_flags |= UP_RUNNING;
        }
        // SAFETY: SIOCSIFFLAGS reads the valid `ifr`.
        ret = unsafe { libc::ioctl(sock, libc::SIOCSIFFLAGS, &ifr) };
    }
    let err = std::io::Error::last_os_error();
    // SAFETY: `sock` is our fd, closed exactly once.
    unsafe { libc::close(sock) };
    if ret < 0 {
        return Err(SetupError::io(STEP, "bringing lo up", err));
    }
    Ok(())
}
