"""For development and tests: a local control plane, and an AdmissionReview builder."""
