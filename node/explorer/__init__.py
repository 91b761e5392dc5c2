"""`polnet explorer`: a read-only web app over the chain and this node's files.

Layers, one way: ``index`` (snapshots of chain state and events, trace manifests
on disk) -> ``pages`` (HTML + SVG, every foreign string escaped) -> ``server``
(stdlib HTTP, GET only, loopback by default).
"""
