//! Issuing IDs and keeping them durable: the driver that runs the generator under its lock,
//! the durable lease (state file, WAL, synchronous standbys), shared memory, the WAL
//! resource manager, the commit-order watermark, what a promoted node knows of the
//! timelines before it, and the origins of IDs taken over from other clusters.

pub(crate) mod driver;
pub(crate) mod lease;
pub(crate) mod origin;
pub(crate) mod shmem;
pub(crate) mod timeline;
pub(crate) mod wal;
pub(crate) mod watermark;
