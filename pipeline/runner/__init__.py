"""Job plumbing: the command line and how a job ends (`cli`), and the stage graph (`dag`)."""
