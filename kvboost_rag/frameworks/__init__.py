"""Framework-free helpers shared by the framework packages (and a later server).

Plain data in, plain data out: the core never imports a framework, and neither does this.
"""
