"""What the next deploy would do, in serving terms: the CDK CLI's own diff of the template an
environment runs now against the one the config synthesizes, read for what it means to the nodes,
the RayService, access and cost. CDK-free: the diff comes from the CLI as text."""
