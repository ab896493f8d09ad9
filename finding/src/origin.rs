//! A finding's URLs point at wherever the scan ran; a retest runs against
//! a lab. Each distinct origin (scheme, host, port) is mapped onto
//! `http://NAME:PORT`, and the mapping is returned to be shown and
//! recorded: nothing is rewritten silently.

use serde::{Deserialize, Serialize};

use crate::{Finding, FindingError};

/// One origin of a finding and the lab origin it became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OriginMap {
    /// As the finding has it (`https://staging.example`).
    pub from: String,
    /// In the lab (`http://demo:8080`).
    pub to: String,
}

/// The finding with every instance's URL on the lab `lab` (whose declared
/// ports are `ports`), and the mapping. The lab's port for an origin is
/// the origin's own port when the lab declares it, else the lab's only
/// port; a lab with several ports, none of them the origin's, is an error
/// (there is no way to tell which serves it).
pub fn onto_lab(
    f: &Finding,
    lab: &str,
    ports: &[u16],
) -> Result<(Finding, Vec<OriginMap>), FindingError> {
    let err = |why: String| FindingError::Origin {
        id: f.id.clone(),
        why,
    };
    let mut out = f.clone();
    let mut maps: Vec<OriginMap> = Vec::new();
    for x in &mut out.instances {
        let u = url::Url::parse(&x.url).map_err(|e| err(format!("{:?}: {e}", x.url)))?;
        let host = u
            .host_str()
            .ok_or_else(|| err(format!("{:?} has no host", x.url)))?;
        let from = match u.port() {
            Some(p) => format!("{}://{host}:{p}", u.scheme()),
            None => format!("{}://{host}", u.scheme()),
        };
        let own = u.port_or_known_default();
        let port = match (own, ports) {
            (Some(p), _) if ports.contains(&p) => p,
            (_, [only]) => *only,
            (_, []) => return Err(err(format!("lab {lab} declares no port"))),
            (_, many) => {
                return Err(err(format!(
                    "{from} uses port {}, which lab {lab} does not declare (it declares {}); start the lab with that port, or give the finding the lab's port",
                    own.map_or("?".to_string(), |p| p.to_string()),
                    many.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
                )))
            }
        };
        let to = format!("http://{lab}:{port}");
        let mut path = u.path().to_string();
        if let Some(q) = u.query() {
            path.push('?');
            path.push_str(q);
        }
        x.url = format!("{to}{path}");
        if let Some(r) = &mut x.request {
            // A raw request's Host header names the scanned host; the
            // request line may carry the absolute URL.
            *r = r.replace(&from, &to);
            let authority = match u.port() {
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            };
            *r = r.replace(
                &format!("Host: {authority}\r\n"),
                &format!("Host: {lab}:{port}\r\n"),
            );
        }
        if !maps.iter().any(|m| m.from == from) {
            maps.push(OriginMap { from, to });
        }
    }
    Ok((out, maps))
}
