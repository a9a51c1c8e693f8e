//! Call results, numbered as the CUDA driver API's `CUresult`, so the guest
//! library can hand them to programs unchanged.
//!
//! A `Status` carries any code: the host passes the driver's own result
//! through, whatever it is. The codes the host and guest produce
//! themselves have names here.

/// A call's result (a `CUresult` code).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(u32);

#[allow(non_upper_case_globals)]
impl Status {
    /// CUDA_SUCCESS
    pub const Success: Status = Status(0);
    /// CUDA_ERROR_INVALID_VALUE
    pub const InvalidValue: Status = Status(1);
    /// CUDA_ERROR_OUT_OF_MEMORY
    pub const OutOfMemory: Status = Status(2);
    /// CUDA_ERROR_NOT_INITIALIZED
    pub const NotInitialized: Status = Status(3);
    /// CUDA_ERROR_NO_DEVICE
    pub const NoDevice: Status = Status(100);
    /// CUDA_ERROR_INVALID_DEVICE
    pub const InvalidDevice: Status = Status(101);
    /// CUDA_ERROR_INVALID_IMAGE
    pub const InvalidImage: Status = Status(200);
    /// CUDA_ERROR_INVALID_CONTEXT
    pub const InvalidContext: Status = Status(201);
    /// CUDA_ERROR_NO_BINARY_FOR_GPU
    pub const NoBinaryForGpu: Status = Status(209);
    /// CUDA_ERROR_INVALID_PTX
    pub const InvalidPtx: Status = Status(218);
    /// CUDA_ERROR_INVALID_HANDLE
    pub const InvalidHandle: Status = Status(400);
    /// CUDA_ERROR_NOT_FOUND
    pub const NotFound: Status = Status(500);
    /// CUDA_ERROR_NOT_READY
    pub const NotReady: Status = Status(600);
    /// CUDA_ERROR_ILLEGAL_ADDRESS
    pub const IllegalAddress: Status = Status(700);
    /// CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    pub const LaunchOutOfResources: Status = Status(701);
    /// CUDA_ERROR_LAUNCH_TIMEOUT
    pub const LaunchTimeout: Status = Status(702);
    /// CUDA_ERROR_HARDWARE_STACK_ERROR
    pub const HardwareStackError: Status = Status(714);
    /// CUDA_ERROR_ILLEGAL_INSTRUCTION
    pub const IllegalInstruction: Status = Status(715);
    /// CUDA_ERROR_MISALIGNED_ADDRESS
    pub const MisalignedAddress: Status = Status(716);
    /// CUDA_ERROR_INVALID_ADDRESS_SPACE
    pub const InvalidAddressSpace: Status = Status(717);
    /// CUDA_ERROR_INVALID_PC
    pub const InvalidPc: Status = Status(718);
    /// CUDA_ERROR_LAUNCH_FAILED
    pub const LaunchFailed: Status = Status(719);
    /// CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
    pub const CooperativeLaunchTooLarge: Status = Status(720);
    /// CUDA_ERROR_INVALID_CLUSTER_SIZE
    pub const InvalidClusterSize: Status = Status(912);
    /// CUDA_ERROR_NOT_PERMITTED
    pub const NotPermitted: Status = Status(800);
    /// CUDA_ERROR_NOT_SUPPORTED
    pub const NotSupported: Status = Status(801);
    /// CUDA_ERROR_MPS_MAX_CLIENTS_REACHED: a vGPU on an MPS GPU already
    /// runs as many guest processes as its contexts allow.
    pub const MpsMaxClientsReached: Status = Status(808);
    /// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
    pub const StreamCaptureUnsupported: Status = Status(900);
    /// CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
    pub const StreamCaptureInvalidated: Status = Status(901);
    /// CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
    pub const StreamCaptureUnmatched: Status = Status(903);
    /// CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    pub const StreamCaptureWrongThread: Status = Status(908);
    /// CUDA_ERROR_UNKNOWN
    pub const Unknown: Status = Status(999);

    /// From a raw code (any code: the driver's results pass through).
    pub fn from_code(c: u32) -> Status {
        Status(c)
    }

    /// The raw code.
    pub fn code(self) -> u32 {
        self.0
    }

    /// Whether the error leaves the context (on a real GPU: every context
    /// of the process) unusable: a kernel faulted (an illegal or misaligned
    /// address, a device-side assert, a trap, an illegal instruction), or
    /// the watchdog killed it. Only a new process recovers.
    pub fn is_sticky(self) -> bool {
        matches!(self.0, 700 | 702 | 710 | 714..=719)
    }

    fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "Success",
            1 => "InvalidValue",
            2 => "OutOfMemory",
            3 => "NotInitialized",
            100 => "NoDevice",
            101 => "InvalidDevice",
            200 => "InvalidImage",
            201 => "InvalidContext",
            209 => "NoBinaryForGpu",
            218 => "InvalidPtx",
            400 => "InvalidHandle",
            500 => "NotFound",
            600 => "NotReady",
            700 => "IllegalAddress",
            701 => "LaunchOutOfResources",
            702 => "LaunchTimeout",
            710 => "Assert",
            714 => "HardwareStackError",
            715 => "IllegalInstruction",
            716 => "MisalignedAddress",
            717 => "InvalidAddressSpace",
            718 => "InvalidPc",
            719 => "LaunchFailed",
            720 => "CooperativeLaunchTooLarge",
            800 => "NotPermitted",
            801 => "NotSupported",
            900 => "StreamCaptureUnsupported",
            901 => "StreamCaptureInvalidated",
            903 => "StreamCaptureUnmatched",
            908 => "StreamCaptureWrongThread",
            999 => "Unknown",
            _ => return None,
        })
    }
}

impl std::fmt::Debug for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_pass_through_and_named_ones_match() {
        assert_eq!(Status::from_code(905).code(), 905);
        assert_eq!(format!("{:?}", Status::from_code(905)), "CUresult(905)");
        assert_eq!(Status::from_code(600), Status::NotReady);
        assert!(matches!(Status::from_code(719), Status::LaunchFailed));
        assert!(Status::MisalignedAddress.is_sticky());
        // A device-side assert and a kernel the watchdog killed poison the
        // process as a fault does (cudaErrorAssert, cudaErrorLaunchTimeout).
        assert!(Status::from_code(710).is_sticky());
        assert!(Status::from_code(702).is_sticky());
        assert!(!Status::from_code(720).is_sticky());
        assert!(!Status::NotReady.is_sticky());
    }
}
