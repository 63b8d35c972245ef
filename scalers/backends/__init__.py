"""Scaler backends: where an admitted agent actually runs.

``base.get_backend(scaler)`` picks the backend for a ``scalers.models.Scaler`` by its type:
``container`` (``container.ContainerBackend``), ``bare-metal`` (``baremetal.BareMetalBackend``),
``event`` (``event.EventBackend``) and ``firecracker`` (``firecracker``, plugged in by its own
package). Spawns run in the rq job ``scalers.jobs.spawn_agent``.
"""
