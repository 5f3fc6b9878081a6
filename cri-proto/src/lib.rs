//! The CRI v1 API (runtime.v1) as gRPC client and server types, plus a unix-socket client.
