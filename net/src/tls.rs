//! The server name in a TLS ClientHello, read from the tunnel's first
//! record without terminating TLS (RFC 8446 4.1.2, RFC 6066 3).

use std::io::Read;
use std::net::TcpStream;

/// TLS's largest plaintext record, plus room for the header.
const MAX_RECORD: usize = 16384 + 5;

/// Read at least the first record (everything read is returned, to be
/// forwarded as is). A first byte that is not a handshake record ends the
/// read at once.
pub fn read_first_record(s: &mut TcpStream, mut buf: Vec<u8>) -> std::io::Result<Vec<u8>> {
    let mut chunk = [0u8; 4096];
    loop {
        if buf.len() >= 5 {
            if buf[0] != 0x16 {
                return Ok(buf);
            }
            let need = 5 + usize::from(u16::from_be_bytes([buf[3], buf[4]]));
            if buf.len() >= need.min(MAX_RECORD) {
                return Ok(buf);
            }
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], ()> {
        if self.0.len() < n {
            return Err(());
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<usize, ()> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, ()> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Result<&'a [u8], ()> {
        let n = self.u16()?;
        self.take(n)
    }
}

/// `Err(())`: not a ClientHello (or one cut short); `Ok(None)`: a
/// ClientHello naming no server; `Ok(Some(name))`: its host name.
pub fn server_name(buf: &[u8]) -> Result<Option<String>, ()> {
    let mut c = Cur(buf);
    let header = c.take(5)?;
    if header[0] != 0x16 || header[1] != 3 {
        return Err(());
    }
    let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
    let mut rec = Cur(c.take(len)?);
    if rec.u8()? != 1 {
        return Err(()); // not a ClientHello
    }
    let hl = rec.take(3)?;
    let hlen = (usize::from(hl[0]) << 16) | (usize::from(hl[1]) << 8) | usize::from(hl[2]);
    // A hello longer than the record (split over records) is read as far
    // as the record goes: the extensions must be in it.
    let body = rec.0;
    let mut h = Cur(&body[..hlen.min(body.len())]);
    h.take(2 + 32)?; // legacy_version, random
    h.vec8()?; // session id
    h.vec16()?; // cipher suites
    h.vec8()?; // compression methods
    if h.0.is_empty() {
        return Ok(None); // no extensions at all
    }
    let mut exts = Cur(h.vec16()?);
    let mut found = None;
    while !exts.0.is_empty() {
        let ty = exts.u16()?;
        let data = exts.vec16()?;
        if ty != 0 {
            continue;
        }
        if found.is_some() {
            return Err(()); // two server_name extensions
        }
        let mut list = Cur(Cur(data).vec16()?);
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let name = list.vec16()?;
            if kind == 0 {
                let s = std::str::from_utf8(name).map_err(|_| ())?;
                if found.is_some() {
                    return Err(());
                }
                found = Some(s.to_owned());
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
pub(crate) fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(n) = sni {
        let mut entry = vec![0u8];
        entry.extend_from_slice(&(n.len() as u16).to_be_bytes());
        entry.extend_from_slice(n.as_bytes());
        let mut list = (entry.len() as u16).to_be_bytes().to_vec();
        list.extend_from_slice(&entry);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
        exts.extend_from_slice(&list);
    }
    // supported_versions, as a real hello carries.
    exts.extend_from_slice(&[0, 43, 0, 3, 2, 3, 4]);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_server_name() {
        assert_eq!(
            server_name(&client_hello(Some("pypi.org"))),
            Ok(Some("pypi.org".into()))
        );
        assert_eq!(server_name(&client_hello(None)), Ok(None));
        assert_eq!(server_name(b"GET / HTTP/1.1\r\n\r\n"), Err(()));
        let h = client_hello(Some("pypi.org"));
        // Cut anywhere: never a panic, never a name.
        for n in 0..h.len() {
            assert_ne!(server_name(&h[..n]), Ok(Some("pypi.org".into())), "{n}");
        }
    }
}
