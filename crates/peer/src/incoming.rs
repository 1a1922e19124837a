//! Replies read with a block's bytes landing straight in the caller's
//! buffer (the node's G2 slot): the `Block` frame's head is read and parsed
//! by itself, then its bytes go to the target, with no frame buffer and no
//! copy between. Any other frame is read whole and decoded as usual.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::error::{DecodeError, PeerError};
use crate::frame::{BLOCK_HEAD, BlockHead, Cursor, FOUND_HEAD, Frame, MAX_FRAME, MAX_LAYERS};
use crate::frame::{get_block_head, read_len};

/// The `Block` frame's type byte.
const BLOCK_TYPE: u8 = 0x11;

/// A reply read by [`read_reply_into`].
pub(crate) enum Incoming {
    /// A `Block` frame's head; `landed` says whether its bytes (if found)
    /// are now in the target. Bytes of another length than the target's
    /// were read and dropped, so the stream stays at a frame boundary.
    Block {
        /// The frame up to its bytes.
        head: BlockHead,
        /// Whether the bytes are in the target.
        landed: bool,
    },
    /// Any other frame.
    Other(Frame),
}

/// Reads the next reply; a found block's bytes go into `target` when they
/// are exactly as long. `Ok(None)` when the stream ends between frames.
pub(crate) async fn read_reply_into<R: AsyncRead + Unpin>(
    r: &mut R,
    target: &mut [u8],
) -> Result<Option<Incoming>, PeerError> {
    let Some(len) = read_len(r, MAX_FRAME).await? else {
        return Ok(None);
    };
    let mut frame = Partial {
        len,
        bytes: Vec::new(),
    };
    frame.need(r, 1).await?;
    if frame.bytes[0] != BLOCK_TYPE {
        frame.need(r, len - 1).await?;
        return Ok(Some(Incoming::Other(Frame::decode(&frame.bytes)?)));
    }
    let head = frame.block_head(r).await?;
    let rest = len - frame.bytes.len();
    let landed = match head.found {
        None if rest > 0 => return Err(trailing(rest)),
        None => false,
        Some(_) if rest == target.len() => {
            r.read_exact(target).await?;
            true
        }
        Some(_) => {
            let mut skip = (&mut *r).take(rest as u64);
            tokio::io::copy(&mut skip, &mut tokio::io::sink()).await?;
            false
        }
    };
    Ok(Some(Incoming::Block { head, landed }))
}

fn trailing(count: usize) -> PeerError {
    DecodeError::Trailing {
        frame: "Block",
        count,
    }
    .into()
}

/// The first bytes of a frame of `len` bytes, read as they are needed.
struct Partial {
    len: usize,
    bytes: Vec<u8>,
}

impl Partial {
    /// Reads `n` more bytes, if the frame has them.
    async fn need<R: AsyncRead + Unpin>(&mut self, r: &mut R, n: usize) -> Result<(), PeerError> {
        if n > self.len - self.bytes.len() {
            let bad = match self.bytes.is_empty() {
                true => DecodeError::Empty,
                false => DecodeError::Malformed {
                    frame: "Block",
                    reason: "body ends inside a field",
                },
            };
            return Err(bad.into());
        }
        let start = self.bytes.len();
        self.bytes.resize(start + n, 0);
        r.read_exact(&mut self.bytes[start..]).await?;
        Ok(())
    }

    /// Reads and parses a `Block` frame's head (its type byte read).
    async fn block_head<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
    ) -> Result<BlockHead, PeerError> {
        self.need(r, BLOCK_HEAD).await?;
        if self.bytes[BLOCK_HEAD] == 1 {
            self.need(r, FOUND_HEAD).await?;
            let at = self.bytes.len() - 4;
            let count = u32::from_le_bytes([0, 1, 2, 3].map(|i| self.bytes[at + i])) as usize;
            // A count over the limit is left for the parser to refuse.
            if count <= MAX_LAYERS {
                self.need(r, count * 8 + 4).await?;
            }
        }
        let mut c = Cursor::new(&self.bytes[1..], "Block");
        let head = get_block_head(&mut c)?;
        c.finish()?;
        Ok(head)
    }
}
