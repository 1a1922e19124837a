//! Mutual authentication of two nodes of one cluster (docs/peer-protocol.md
//! §3): each side draws a fresh nonce, and each proves that it holds the
//! cluster secret by a keyed BLAKE3 hash over the whole handshake
//! transcript (cluster name, both node names, both nonces) and its role.
//!
//! Why this shape: a proof over both nonces cannot be replayed on another
//! connection (the other side's nonce is new each time); the role tag stops
//! a server's proof from being reflected back as a client's; the names in
//! the transcript stop a proof made for one pair of nodes from being used
//! for another. The secret itself never crosses the wire.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::error::SecretError;
use crate::frame::{NONCE_BYTES, PROOF_BYTES};

/// Bytes of a [`ClusterSecret`].
pub const SECRET_BYTES: usize = 32;

/// Domain tag of the key proofs are made with: frozen (a new derivation
/// takes a new tag and a new major version).
const AUTH_TAG: &[u8] = b"kvtier-peer-auth-v1\0";

/// The secret every node of one cluster shares: 32 bytes, kept in a file
/// only the daemon's user can read.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterSecret([u8; SECRET_BYTES]);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the secret.
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// The secret with these bytes.
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Self {
        Self(bytes)
    }

    /// Reads the secret at `path`: exactly [`SECRET_BYTES`] bytes in a
    /// regular file of this user that nobody else may read or write (a
    /// symbolic link is refused, as anyone who can change it could point
    /// it elsewhere).
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let io = |op, source| SecretError::Io {
            op,
            path: path.to_owned(),
            source,
        };
        // O_NOFOLLOW: the checks below are of the file opened, and a link
        // swapped in after a check of the path could point anywhere.
        // O_NONBLOCK: a FIFO put there must not hang the start (it is then
        // refused as not a regular file).
        let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(flags.bits() as i32)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => {
                    SecretError::Refused {
                        path: path.to_owned(),
                        why: "a symbolic link".into(),
                    }
                }
                _ => io("opening", e),
            })?;
        let meta = file.metadata().map_err(|e| io("inspecting", e))?;
        if let Some(why) = untrusted(&meta) {
            return Err(SecretError::Refused {
                path: path.to_owned(),
                why,
            });
        }
        let mut bytes = Vec::with_capacity(SECRET_BYTES + 1);
        (&mut file)
            .take(SECRET_BYTES as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| io("reading", e))?;
        let bytes: [u8; SECRET_BYTES] = bytes.try_into().map_err(|_| SecretError::Refused {
            path: path.to_owned(),
            why: format!("not exactly {SECRET_BYTES} bytes"),
        })?;
        Ok(Self(bytes))
    }

    /// A 32-byte key for another use of the cluster secret, derived with
    /// BLAKE3's key derivation under `context` (a constant naming that use
    /// and its version): keys of different contexts are independent, and
    /// none equals the handshake's. The secret's bytes never leave this type.
    pub fn derive_key(&self, context: &'static str) -> [u8; 32] {
        blake3::derive_key(context, &self.0)
    }

    /// The key proofs are made with: derived under its own domain tag, so
    /// a secret also used for something else never yields the same MACs.
    fn auth_key(&self) -> [u8; 32] {
        blake3::keyed_hash(&self.0, AUTH_TAG).into()
    }
}

/// Why a secret file with these metadata (of the opened file) cannot be
/// trusted, if it cannot.
fn untrusted(meta: &std::fs::Metadata) -> Option<String> {
    if !meta.file_type().is_file() {
        return Some("not a regular file".into());
    }
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Some(format!(
            "owned by uid {}, not this process's {euid}",
            meta.uid()
        ));
    }
    let mode = meta.mode() & 0o777;
    (mode & 0o077 != 0).then(|| format!("mode {mode:04o}: others may read it (chmod 600 it)"))
}

/// Which side of the handshake a proof speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The connecting node.
    Client,
    /// The accepting node.
    Server,
}

/// Everything both sides said in a handshake, which both proofs cover
/// (docs/peer-protocol.md §3.2).
#[derive(Debug, Clone, Copy)]
pub struct Transcript<'a> {
    /// The cluster's name.
    pub cluster: &'a str,
    /// The client's node name, from `Hello`.
    pub client: &'a str,
    /// The server's node name, from `HelloOk`.
    pub server: &'a str,
    /// The client's nonce, from `Hello`.
    pub client_nonce: &'a [u8; NONCE_BYTES],
    /// The server's nonce, from `HelloOk`.
    pub server_nonce: &'a [u8; NONCE_BYTES],
}

impl Transcript<'_> {
    /// The proof `role` makes (or must make) with `secret`.
    pub fn proof(&self, secret: &ClusterSecret, role: Role) -> [u8; PROOF_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&secret.auth_key());
        h.update(match role {
            Role::Client => b"client",
            Role::Server => b"server",
        });
        // Names are length-prefixed so no two transcripts hash alike.
        for name in [self.cluster, self.client, self.server] {
            h.update(&(name.len() as u64).to_le_bytes());
            h.update(name.as_bytes());
        }
        h.update(self.client_nonce);
        h.update(self.server_nonce);
        h.finalize().into()
    }

    /// Whether `proof` is `role`'s, compared in constant time.
    pub fn verify(&self, secret: &ClusterSecret, role: Role, proof: &[u8; PROOF_BYTES]) -> bool {
        blake3::Hash::from(self.proof(secret, role)) == blake3::Hash::from(*proof)
    }
}

/// A fresh random nonce from the thread's cryptographic generator.
pub(crate) fn nonce() -> [u8; NONCE_BYTES] {
    rand::random()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn transcript<'a>(a: &'a [u8; 32], b: &'a [u8; 32]) -> Transcript<'a> {
        Transcript {
            cluster: "c",
            client: "a",
            server: "b",
            client_nonce: a,
            server_nonce: b,
        }
    }

    #[test]
    fn proofs_bind_secret_role_and_transcript() {
        let s = ClusterSecret::from_bytes([7; 32]);
        let (n1, n2) = ([1; 32], [2; 32]);
        let t = transcript(&n1, &n2);
        let p = t.proof(&s, Role::Client);
        assert!(t.verify(&s, Role::Client, &p));
        assert!(!t.verify(&s, Role::Server, &p), "no reflection");
        assert!(!t.verify(&ClusterSecret::from_bytes([8; 32]), Role::Client, &p));
        assert!(
            !transcript(&n2, &n1).verify(&s, Role::Client, &p),
            "nonces bound"
        );
        let other = Transcript {
            client: "x",
            ..transcript(&n1, &n2)
        };
        assert!(!other.verify(&s, Role::Client, &p), "names bound");
    }

    #[test]
    fn a_private_secret_file_is_read_and_others_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.secret");
        std::fs::write(&path, [5u8; 32]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = ClusterSecret::from_file(&path).unwrap();
        assert_eq!(s, ClusterSecret::from_bytes([5; 32]));
        assert_eq!(format!("{s:?}"), "ClusterSecret(..)");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&path),
            Err(SecretError::Refused { .. })
        ));

        std::fs::write(&path, [5u8; 31]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&path),
            Err(SecretError::Refused { .. })
        ));

        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&link),
            Err(SecretError::Refused { .. })
        ));
        assert!(matches!(
            ClusterSecret::from_file(&dir.path().join("absent")),
            Err(SecretError::Io { .. })
        ));

        // A FIFO is refused at once rather than waited on for a writer.
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
        )
        .unwrap();
        assert!(matches!(
            ClusterSecret::from_file(&fifo),
            Err(SecretError::Refused { .. })
        ));
    }
}
