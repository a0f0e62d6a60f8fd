//! `multipart/form-data` bodies, as the audio endpoints take them: read whole (the body is
//! already in memory, under the route's limit) into named fields and at most one file.

use crate::ApiError;
use bytes::Bytes;

/// One uploaded file.
#[derive(Clone, Debug)]
pub struct FormFile {
    pub name: Option<String>,
    pub content_type: Option<String>,
    pub bytes: Bytes,
}

/// The fields of a form: text fields in order (a name may repeat, as `timestamp_granularities[]`
/// does) and the `file` part.
#[derive(Clone, Debug, Default)]
pub struct Form {
    pub fields: Vec<(String, String)>,
    pub file: Option<FormFile>,
}

impl Form {
    /// Reads a body sent as `content_type` (which must be multipart, with its boundary).
    pub async fn read(content_type: Option<&str>, body: Bytes) -> Result<Form, ApiError> {
        let content_type = content_type.unwrap_or_default();
        let boundary = multer::parse_boundary(content_type).map_err(|_| {
            ApiError::bad_request(format!(
                "this endpoint takes multipart/form-data (a `file` and the other fields), not `{content_type}`"
            ))
        })?;
        let stream = futures_util::stream::once(async move { Ok::<Bytes, std::convert::Infallible>(body) });
        let mut multipart = multer::Multipart::new(stream, boundary);
        let mut form = Form::default();
        let broken = |e: multer::Error| ApiError::bad_request(format!("the multipart body is malformed: {e}"));
        while let Some(field) = multipart.next_field().await.map_err(broken)? {
            let name = field.name().unwrap_or_default().to_owned();
            if name == "file" {
                if form.file.is_some() {
                    return Err(ApiError::invalid("file", "send one file per request"));
                }
                let file_name = field.file_name().map(str::to_owned);
                let content_type = field.content_type().map(|m| m.to_string());
                let bytes = field.bytes().await.map_err(broken)?;
                form.file = Some(FormFile { name: file_name, content_type, bytes });
            } else {
                let value = field.text().await.map_err(broken)?;
                form.fields.push((name, value));
            }
        }
        Ok(form)
    }

    /// The last value of a field, as a form sent twice means the later one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields.iter().rev().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// Every value of a repeated field, accepting both `name[]` and `name`.
    pub fn all(&self, name: &str) -> Vec<&str> {
        let bracketed = format!("{name}[]");
        self.fields.iter().filter(|(n, _)| n == name || *n == bracketed).map(|(_, v)| v.as_str()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Bytes) {
        let mut out = Vec::new();
        for (name, file, value) in parts {
            out.extend_from_slice(b"--XyZ\r\n");
            match file {
                Some(f) => out.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: audio/wav\r\n\r\n").as_bytes(),
                ),
                None => out.extend_from_slice(format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes()),
            }
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"--XyZ--\r\n");
        ("multipart/form-data; boundary=XyZ".into(), Bytes::from(out))
    }

    fn read(content_type: &str, body: Bytes) -> Result<Form, ApiError> {
        futures_executor::block_on(Form::read(Some(content_type), body))
    }

    #[test]
    fn fields_and_the_file_are_read() {
        let (ct, b) = body(&[
            ("model", None, b"whisper-1"),
            ("file", Some("a.wav"), b"RIFF\x00\x01"),
            ("timestamp_granularities[]", None, b"word"),
            ("timestamp_granularities[]", None, b"segment"),
        ]);
        let form = read(&ct, b).unwrap();
        assert_eq!(form.get("model"), Some("whisper-1"));
        assert_eq!(form.all("timestamp_granularities"), ["word", "segment"]);
        let file = form.file.unwrap();
        assert_eq!((file.name.as_deref(), &file.bytes[..]), (Some("a.wav"), &b"RIFF\x00\x01"[..]));
    }

    #[test]
    fn json_bodies_and_two_files_are_refused() {
        let e = read("application/json", Bytes::from_static(b"{}")).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("multipart/form-data"), "{}", e.message);
        let (ct, b) = body(&[("file", Some("a.wav"), b"1"), ("file", Some("b.wav"), b"2")]);
        assert_eq!(read(&ct, b).unwrap_err().param.as_deref(), Some("file"));
        let e = read("multipart/form-data; boundary=XyZ", Bytes::from_static(b"--XyZ\r\nnonsense")).unwrap_err();
        assert!(e.message.contains("malformed"), "{}", e.message);
    }
}
