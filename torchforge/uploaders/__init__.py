"""One uploader per target kind (directory, anaconda, quetz), each implementing `base.Uploader`."""
