"""Schemathesis hooks for scripts/fuzz-api.sh (loaded through SCHEMATHESIS_HOOKS).

A snapshot's artifact (`GET`/`PUT /v1/snapshots/{id}/artifact`, docs/fleet.md) is an OCI image
layout in one tar stream, `application/vnd.oci.image.layout.v1+tar`: bytes, which schemathesis
sends as it sends `application/octet-stream` once told so (without this it reports the route
as "Serialization not possible" and fails the run).
"""

import schemathesis

schemathesis.serializer.alias("application/vnd.oci.image.layout.v1+tar", "application/octet-stream")
# An image's archive (`GET`/`PUT /v1/images/archive`) is a tar stream too.
schemathesis.serializer.alias("application/x-tar", "application/octet-stream")
