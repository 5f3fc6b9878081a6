//! Container probes (exec, httpGet, tcpSocket, grpc) and the per-probe workers that run them.
