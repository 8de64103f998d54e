"""`nvhook serve`: a warm process that runs the OCI hook for the compiled front.

A one-shot hook pays Python's start-up, its imports and a snapshot read on every GPU
container (~100 ms before any work). The server pays them once: it imports everything
the hook needs, keeps discovery results in memory, and forks a worker per request (a
fork of a warm process costs ~1 ms). csrc/hookfront.c hands GPU containers over on a
unix socket and falls back to exec'ing Python when no server answers, so the service
is optional and the hook's behaviour is the same either way: the worker runs
libinject.runtime.hook.handle(), the very function the exec'd Python runs.

One module per role, each importing only modules listed below it (the children see the
server as children.Parent, a type):
  server.py        the loop: accepts peers, hands requests to spares or forked workers,
                   keeps what workers learned, and its children's bookkeeping
  prober.py        the prober child: each request's discovery fingerprint, on another CPU
  worker.py        a request's worker, and a spare before its request comes
  listen.py        the socket: bind() under a lock, serving()
  preload.py       what is imported before any fork (PRELOAD)
  fallback.py      the log line of a start the front ran without the service
  driver_cache.py  discovery and plans, remembered (DriverCache)
  prefault.py      the pages spares copy ahead, learned from workers' pagemaps
  protocol.py      the wire format (the protocol itself is described there), Request
  shim.py          the runtime shim's `create`, the other request kind
  peer.py          the peer's proof: credentials, namespaces (the trust model is there)
  children.py      the children's scheduling class and inherited fds

Nothing is imported here, so a front's tests or `nvhook setup` (listen.serving) load only
what they use.
"""
