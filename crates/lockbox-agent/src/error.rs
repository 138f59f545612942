//! Violations of the protocol's contract, seen by the runtime's end.

/// The agent answered something this end of the protocol cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The agent speaks another version of the protocol (an agent executable from another
    /// build of lockbox).
    #[error(
        "the sandbox agent speaks protocol version {agent}, this runtime speaks version \
         {runtime}: run the agent executable of the same lockbox build"
    )]
    VersionMismatch {
        /// This end's [`crate::PROTOCOL_VERSION`].
        runtime: u32,
        /// The agent's (0 = an agent that predates versioning).
        agent: u32,
    },
    /// A reply of another kind than the request calls for.
    #[error("the sandbox agent replied `{received}` where `{expected}` was expected")]
    UnexpectedReply {
        /// The kind the request calls for ([`crate::Body::kind`]).
        expected: &'static str,
        /// The kind that came.
        received: &'static str,
    },
}
