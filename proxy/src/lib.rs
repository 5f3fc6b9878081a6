//! kube-proxy: Services and EndpointSlices rendered into kernel NAT rules.
