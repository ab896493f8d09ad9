//! A small synchronous rtnetlink client: one request, one ACK.
//!
//! A netlink socket stays bound to the network namespace it was created
//! in, so a caller opens one per namespace, right after entering it
//! (see docs/adr/0301-lab-network-wiring.md).

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};

/// An rtnetlink socket in the namespace it was opened in.
pub struct Netlink {
    sock: Socket,
    seq: u32,
}

impl Netlink {
    /// Open a socket in the calling thread's current network namespace.
    pub fn open() -> io::Result<Self> {
        let sock = Socket::new(NETLINK_ROUTE)?;
        Ok(Netlink { sock, seq: 0 })
    }

    fn request(&mut self, msg: RouteNetlinkMessage, flags: u16) -> io::Result<()> {
        self.seq += 1;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = self.seq;
        let mut nl = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        nl.finalize();
        let mut buf = vec![0u8; nl.buffer_len()];
        nl.serialize(&mut buf);
        self.sock.send_to(&buf, &SocketAddr::new(0, 0), 0)?;
        loop {
            let (reply, _) = self.sock.recv_from_full()?;
            let mut off = 0;
            while off < reply.len() {
                let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply[off..])
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
                let len = msg.header.length as usize;
                if msg.header.sequence_number == self.seq {
                    if let NetlinkPayload::Error(e) = msg.payload {
                        return match e.code {
                            None => Ok(()),
                            Some(code) => Err(io::Error::from_raw_os_error(-code.get())),
                        };
                    }
                }
                if len == 0 {
                    break;
                }
                off += (len + 3) & !3;
            }
        }
    }

    /// Create a veth pair: `name` here, `peer` in the namespace `peer_ns`.
    /// Fails with EEXIST if `name` is taken (the caller picks another).
    pub fn create_veth(
        &mut self,
        name: &str,
        peer: &str,
        peer_ns: BorrowedFd<'_>,
    ) -> io::Result<()> {
        let mut peer_msg = LinkMessage::default();
        peer_msg.attributes = vec![
            LinkAttribute::IfName(peer.into()),
            LinkAttribute::NetNsFd(peer_ns.as_raw_fd()),
        ];
        let mut msg = LinkMessage::default();
        msg.attributes = vec![
            LinkAttribute::IfName(name.into()),
            LinkAttribute::LinkInfo(vec![
                LinkInfo::Kind(InfoKind::Veth),
                LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
            ]),
        ];
        self.request(RouteNetlinkMessage::NewLink(msg), NLM_F_CREATE | NLM_F_EXCL)
    }

    /// The index of the interface `name` in this socket's namespace
    /// (SIOCGIFINDEX on the netlink socket itself).
    pub fn index(&self, name: &str) -> io::Result<u32> {
        rustix::net::netdevice::name_to_index(&self.sock, name).map_err(io::Error::from)
    }

    /// Bring the link `index` up.
    pub fn link_up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(msg), 0)
    }

    /// Add `addr/prefix` to the link `index`.
    pub fn add_address(&mut self, index: u32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix;
        msg.header.index = index;
        msg.header.scope = if addr.is_loopback() {
            AddressScope::Host
        } else {
            AddressScope::Universe
        };
        msg.attributes = vec![
            AddressAttribute::Local(IpAddr::V4(addr)),
            AddressAttribute::Address(IpAddr::V4(addr)),
        ];
        self.request(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }

    /// A host route to `dst` straight out of the link `index` (no gateway).
    pub fn add_link_route(&mut self, index: u32, dst: Ipv4Addr) -> io::Result<()> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = AddressFamily::Inet;
        msg.header.destination_prefix_length = 32;
        msg.header.table = RouteMessage::default().header.table.max(254);
        msg.header.protocol = RouteProtocol::Static;
        msg.header.scope = RouteScope::Link;
        msg.header.kind = RouteType::Unicast;
        msg.attributes = vec![
            RouteAttribute::Destination(RouteAddress::Inet(dst)),
            RouteAttribute::Oif(index),
        ];
        self.request(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
        )
    }
}
