"""The Ray Serve application shipped to the cluster (and run locally on a CPU).

It imports no CDK: the same package is the RayService's ``import_path`` on EKS and the app that
``make local`` serves. The CDK side renders ``serveConfigV2`` from :mod:`serve_app.spec`.
"""
