"""The lake around the job: table health, the maintenance sidecar, table operations and `iotlake status`."""
