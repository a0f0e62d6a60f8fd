mod real_files;
