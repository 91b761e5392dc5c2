"""Prometheus metrics of one node process, served on 127.0.0.1 at /metrics."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


@dataclass
class Metrics:
    registry: CollectorRegistry
    jobs: Gauge
    steps: Counter
    steps_per_second: Gauge
    verdicts: Counter
    bytes_served: Gauge
    stake: Gauge
    credits_withdrawn: Counter
    reachable: Gauge
    relay_addrs: Gauge
    peers: Gauge
    relayed_bytes: Gauge

    @classmethod
    def create(cls) -> Metrics:
        reg = CollectorRegistry()
        return cls(
            registry=reg,
            jobs=Gauge("polnet_jobs", "Jobs this node is working on, by state", ["state"],
                       registry=reg),
            steps=Counter("polnet_training_steps", "Training or replay steps run",
                          registry=reg),
            steps_per_second=Gauge("polnet_steps_per_second", "Last measured steps/s",
                                   registry=reg),
            verdicts=Counter("polnet_verdicts", "Segment verdicts reached", ["result"],
                             registry=reg),
            bytes_served=Gauge("polnet_bytes_served", "Artifact bytes served to peers",
                               registry=reg),
            stake=Gauge("polnet_stake", "Stake held in the registry (token wei)", ["kind"],
                        registry=reg),
            credits_withdrawn=Counter("polnet_credits_withdrawn",
                                      "Token wei withdrawn from the contracts", registry=reg),
            reachable=Gauge("polnet_reachable", "Dial-back verdict: 1 public, 0 private "
                            "(behind NAT), -1 unknown", registry=reg),
            relay_addrs=Gauge("polnet_relay_addrs", "Relayed (/p2p-circuit) addresses held "
                              "(one per relay reservation)", registry=reg),
            peers=Gauge("polnet_peers", "Connected peers, by connection kind", ["kind"],
                        registry=reg),
            relayed_bytes=Gauge("polnet_relayed_bytes", "Bytes this node relayed for others "
                                "(as a circuit relay)", registry=reg),
        )

    def serve(self, port: int) -> int:
        """Serve /metrics on 127.0.0.1:port (0 picks a free port); returns the port."""
        server, _thread = start_http_server(port, addr="127.0.0.1", registry=self.registry)
        return int(server.server_port)
